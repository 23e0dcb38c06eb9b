"""Rule provenance: results/provenance.json (config, commit, code per table, versions, model identity,
seeds, the hosts and devices each rule's jobs ran on, wall time per rule). Its own benchmark file is
left out: it is written after this job."""

import uph.job_start
from uph.io import write_json
from uph.logs import rule_logging
from uph.model_identity import read_identity
from uph.report.provenance import provenance

from pathlib import Path

with rule_logging(snakemake) as log:
    record = provenance(
        snakemake.params.config,
        read_identity(Path(snakemake.input.model).parent),
        Path(uph.__file__).resolve().parent.parent,  # the checkout whose code ran (`import uph.job_start` binds uph)
        {
            rule: str(Path(snakemake.config["results"]) / pattern)
            for rule, pattern in snakemake.params.benchmarks.items()
        },
        exclude_rule=snakemake.rule,
        tables_dir=Path(snakemake.config["results"]) / "tables",
        logs_dir=Path(snakemake.config["results"]) / "logs",
    )
    write_json(record, snakemake.output[0])
    older = sorted(name for name, code in record["tables"].items() if code["older_code"])
    log.info(
        "commit %s, %d rules timed, tables by older code: %s",
        record["git"]["commit"],
        len(record["wall_seconds_per_rule"]),
        older or "none",
    )
