"""Rule model: install the candidate folder that passed every admission check as results/model."""

import uph.job_start
from uph.logs import rule_logging
from uph.model_identity import install_model_folder, read_identity

from pathlib import Path

with rule_logging(snakemake) as log:
    model_dir = Path(snakemake.output.identity).parent
    install_model_folder(Path(snakemake.input.candidate), model_dir)
    log.info("installed %s as %s", read_identity(model_dir)["name"], model_dir)
