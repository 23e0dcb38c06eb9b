"""Rule svd_basis: the top singular triplets of the model's lm_head weight."""

import uph.job_start
from uph.lm.data.basis import save_basis, top_singular_triplets
from uph.lm.data.models import read_output_layer
from uph.logs import rule_logging
from uph.model_identity import read_identity

from pathlib import Path

with rule_logging(snakemake) as log:
    model_dir = Path(snakemake.input.model).parent
    W = read_output_layer(model_dir).W
    rank = min(snakemake.params.rank, min(W.shape))
    U, S, Vh = top_singular_triplets(W, rank)
    log.info("W %s: top %d singular values %.3g .. %.3g", tuple(W.shape), rank, S[0], S[-1])
    save_basis(snakemake.output[0], U, S, Vh, read_identity(model_dir)["weights_sha256"])
