"""Rule model_candidate: materialize the configured model source into the candidate folder; identity.json
is written last, once the folder loaded back passes every admission check (complete weights, causal
attention, tokenizer within the vocabulary, the suite's base log-probs the model's own)."""

import uph.job_start
from uph.config import check_against_model
from uph.lm.data.models import materialize
from uph.logs import rule_logging

from pathlib import Path

with rule_logging(snakemake) as log:
    spec = snakemake.params.model
    log.info("materializing %s from %s", spec["name"], spec["source"])
    identity = materialize(
        spec["name"],
        spec["source"],
        Path(snakemake.output.folder),
        gguf_file=spec["gguf_file"],
        revision=spec["revision"],
        trust_remote_code=spec["trust_remote_code"],
    )
    log.info(
        "%s: %s, %d parameters, weights sha256 %s",
        identity["name"],
        identity["architecture"],
        identity["n_parameters"],
        identity["weights_sha256"][:12],
    )
    log.info(
        "logits: scale %g, softcap %s; the suite's log-probs match the model's own to %.2g nats over %d positions",
        identity["logit_transform"]["scale"],
        identity["logit_transform"]["softcap"],
        identity["parity"]["max_logprob_diff"],
        identity["parity"]["positions"],
    )
    check_against_model(snakemake.config, identity)
