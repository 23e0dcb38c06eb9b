"""Rule feedback_train: train the character MLP with one method for each seed, one after another; write
their curves to one file."""

import uph.job_start
from uph.artifacts import ROLES_FILE
from uph.device import job_device, resolve_device
from uph.feedback.char_lm import char_corpus
from uph.feedback.training import TrainConfig, train_seeds
from uph.io import write_parquet
from uph.logs import rule_logging

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    section = snakemake.params.feedback
    config = TrainConfig.from_config(section)
    text = "\n".join(ROLES_FILE.read_parquet(snakemake.input.roles)["text"])
    corpus = char_corpus(text, section["test_fraction"], config.context)
    method, seeds = snakemake.wildcards.method, section["seeds"]
    log.info(
        "%s, %d seeds: %d train and %d held-out characters, vocabulary of %d",
        method,
        len(seeds),
        len(corpus.train),
        len(corpus.test),
        len(corpus.vocab),
    )

    def progress(curves):
        last = curves.iloc[-1]
        log.info(
            "seed %d (%d of %d) after %d steps in %.1f s (signal %s, %.2f ms per step): held-out loss %.4f, "
            "accuracy %.4f",
            last["seed"],
            seeds.index(last["seed"]) + 1,
            len(seeds),
            last["step"],
            last["seconds"],
            last["signal"],
            1000 * last["update_seconds"] / last["step"],
            last["test_loss"],
            last["test_acc"],
        )

    device = resolve_device(job_device(snakemake.rule, snakemake.config))
    write_parquet(train_seeds(corpus, method, seeds, config, device, progress), snakemake.output[0])
