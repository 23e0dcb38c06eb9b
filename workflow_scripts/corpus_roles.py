"""Rule corpus_roles: all users' text (Shakespeare roles or a corpus file) as one parquet table."""

import uph.job_start
from uph.io import write_parquet
from uph.lm.data.corpus import load_shakespeare_roles, read_corpus_file
from uph.logs import rule_logging

with rule_logging(snakemake) as log:
    if snakemake.params.source == "shakespeare":
        roles = load_shakespeare_roles(snakemake.params.plays)
    else:  # a corpus file: its content digest is the param (rules/common.smk, corpus_settings)
        roles = read_corpus_file(snakemake.input.corpus[0])
    log.info("%d users, %d characters of text", len(roles), roles["text"].str.len().sum())
    write_parquet(roles, snakemake.output[0])
