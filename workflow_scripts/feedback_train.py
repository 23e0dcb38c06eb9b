"""Rule feedback_train: train the character MLP with one method and seed; write its curves."""

import uph.job_start
from uph.artifacts import ROLES_FILE
from uph.device import job_device, resolve_device
from uph.feedback.char_lm import char_corpus
from uph.feedback.training import TrainConfig, train
from uph.io import write_parquet
from uph.logs import rule_logging

import torch

with rule_logging(snakemake) as log:
    torch.set_num_threads(snakemake.threads)
    section = snakemake.params.feedback
    config = TrainConfig.from_config(section)
    text = "\n".join(ROLES_FILE.read_parquet(snakemake.input.roles)["text"])
    corpus = char_corpus(text, section["test_fraction"], config.context)
    method, seed = snakemake.wildcards.method, int(snakemake.wildcards.seed)
    log.info(
        "%s, seed %d: %d train and %d held-out characters, vocabulary of %d",
        method,
        seed,
        len(corpus.train),
        len(corpus.test),
        len(corpus.vocab),
    )
    curves = train(corpus, method, seed, config, resolve_device(job_device(snakemake.rule, snakemake.config)))
    last = curves.iloc[-1]
    log.info(
        "after %d steps (signal %s, %.2f ms per step): held-out loss %.4f, accuracy %.4f",
        last["step"],
        last["signal"],
        1000 * last["update_seconds"] / last["step"],
        last["test_loss"],
        last["test_acc"],
    )
    write_parquet(curves, snakemake.output[0])
