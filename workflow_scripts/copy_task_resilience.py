"""Rule gram_resilience: seed 004's resilience table, dot product vs Gram determinant."""

import uph.job_start
from uph.attention.copy_task import gram_resilience
from uph.io import write_table
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    table = gram_resilience()
    lines = [f"{'Mag(K)':<10} | {'Dot(Q,K)':<12} | {'Gram(Q,K,R)':<15} | Result"]
    for i, row in enumerate(table.itertuples()):
        magnitude = "1.0 (Ref)" if i == 0 else f"{row.magnitude:.1f}"
        lines.append(f"{magnitude:<10} | {row.dot:<12.4f} | {row.gram:<15.4f} | {row.result}")
    log.info("resilience of the Gram determinant against loud mismatches:\n%s", "\n".join(lines))
    write_table(table, snakemake.output.csv)
