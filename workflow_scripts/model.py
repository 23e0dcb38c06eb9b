"""Rule model: materialize the configured model source (identity.json is written last)."""

from pathlib import Path

from uph.config import check_against_model
from uph.lm.models import materialize
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    spec = snakemake.params.model
    log.info("materializing %s from %s", spec["name"], spec["source"])
    identity = materialize(
        spec["name"],
        spec["source"],
        Path(snakemake.output.identity).parent,
        gguf_file=spec["gguf_file"],
        revision=spec["revision"],
    )
    log.info(
        "%s: %s, %d parameters, weights sha256 %s",
        identity["name"],
        identity["architecture"],
        identity["n_parameters"],
        identity["weights_sha256"][:12],
    )
    check_against_model(snakemake.config, identity)
