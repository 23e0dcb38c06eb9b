"""Rule capacity: every arm's capacity (radius, or the unigram's lambda) chosen from the validation rows of
fit_global and every validate job (uph.lm.capacity)."""

import pandas as pd

from uph.io import write_parquet
from uph.lm.capacity import EDGES
from uph.lm.sweep import capacity_choices
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    validation = pd.concat(map(pd.read_parquet, [snakemake.input.global_validation, *snakemake.input.validation]))
    choices = capacity_choices(validation)
    for _, row in choices[choices["at_edge"].isin(EDGES)].iterrows():
        log.warning(
            "%s: chosen at the grid's %s end",
            row.drop(["validation_nll", "n_users", "grid_size"]).to_dict(),
            row["at_edge"],
        )
    write_parquet(choices, snakemake.output[0])
