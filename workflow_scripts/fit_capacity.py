"""Rule capacity: every arm's capacity (radius, or the unigram's lambda) chosen from the validation rows of
fit_global and every validate job (uph.lm.engine.capacity)."""

import uph.job_start
from uph.artifacts import check_fit_inputs, job_record, write_recorded
from uph.lm.engine.capacity import EDGES
from uph.lm.jobs.choices import capacity_choices
from uph.lm.jobs.tables import read_in_user_order
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    record = job_record(snakemake.input.model, fit=snakemake.params.fit, extract=snakemake.params.cache)
    check_fit_inputs(snakemake.input, record)  # every stale or damaged fit file in one line
    validation = read_in_user_order(snakemake.input.validation, record)
    choices = capacity_choices(validation)
    for _, row in choices[choices["at_edge"].isin(EDGES)].iterrows():
        log.warning(
            "%s: chosen at the grid's %s end",
            row.drop(["validation_nll", "n_users", "grid_size"]).to_dict(),
            row["at_edge"],
        )
    write_recorded(choices, snakemake.output[0], record)
