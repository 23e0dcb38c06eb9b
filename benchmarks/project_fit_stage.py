"""Project a study's fit-stage job-seconds from a measured slice of it: the same config on a few users.

    .venv/bin/python benchmarks/project_fit_stage.py --slice results-slice --users results-full/corpus/users.parquet

The slice is the target config run on its largest users (e.g. config/full.yaml with corpus.max_users: 2).
Its validate and fit jobs' seconds split into the paths and refits of every method and arm, which scale with
a user's tokens, the dose-response's prefixes, which cost the same for every user long enough to have them,
and the rest of the job (p0, scoring), which scales with tokens. Summed over the target's users (their token
counts from its users.parquet), with fit_global as measured (its pool is capped) and fit_others scaled by
held-out tokens. Prints job-seconds per rule and their sum. Not projected: the cross-user matrix, whose cost
per (theta, held-out token) pair a slice of a few users cannot separate from its start-up.
"""

from __future__ import annotations

import argparse
from pathlib import Path

import pandas as pd

from uph.lm.splits import split_lengths


def job_seconds(results: Path, pattern: str) -> float:
    return sum(float(pd.read_csv(path, sep="\t")["s"].sum()) for path in results.glob(f"benchmarks/{pattern}"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slice", type=Path, required=True, help="results folder of the measured slice")
    parser.add_argument("--users", type=Path, required=True, help="users.parquet of the study to project")
    parser.add_argument("--validation-fraction", type=float, default=0.2)
    parser.add_argument("--gap", type=int, default=128)
    args = parser.parse_args()
    validation = pd.concat(map(pd.read_parquet, args.slice.glob("fit/shard-*/validation.parquet")))
    fits = pd.concat(map(pd.read_parquet, args.slice.glob("fit/shard-*/fits.parquet")))
    sizes = fits.groupby("user")[["train_tokens", "test_tokens"]].first()
    fit_part = sum(split_lengths(int(n), args.validation_fraction, args.gap)[0] for n in sizes["train_tokens"])
    train, test = int(sizes["train_tokens"].sum()), int(sizes["test_tokens"].sum())

    all_tokens = validation["train_tokens"].isna()
    path_rate = validation.loc[all_tokens, "seconds"].sum() / fit_part  # per fit-part token
    dose = validation[~all_tokens].groupby("train_tokens")["seconds"].sum() / len(sizes)  # per user, per k
    validate_rest = (job_seconds(args.slice, "fit-validate-shard~*.tsv") - validation["seconds"].sum()) / train
    arms = [column for column in fits.columns if column.endswith("_seconds")]
    refit_rate = fits[arms].sum().sum() / train
    dose_refit = dose * refit_rate / path_rate  # a prefix's refit costs what its path does, as the arms' do
    fit_rest = (job_seconds(args.slice, "fit-shard~*.tsv") - fits[arms].sum().sum()) / train
    fit_rest -= dose_refit.sum() * len(sizes) / train  # the slice's users had every prefix

    users = pd.read_parquet(args.users)
    n_train = users["train_end"]
    n_test = users["n_tokens"] - users["test_start"]
    target_fit_part = sum(split_lengths(int(n), args.validation_fraction, args.gap)[0] for n in n_train)
    doses = sum(float(dose[dose.index < n].sum() + dose_refit[dose_refit.index < n].sum()) for n in n_train)
    projected = {
        "fit_global (as measured: a capped pool)": job_seconds(args.slice, "fit-global.tsv"),
        "validate": path_rate * target_fit_part + validate_rest * n_train.sum(),
        "fit": refit_rate * n_train.sum() + fit_rest * n_train.sum(),
        "dose-response (validate and fit)": doses,
        "fit_others": job_seconds(args.slice, "fit-others.tsv") * n_test.sum() / test,
    }
    print(f"slice: {len(sizes)} users, {train} train and {test} held-out tokens; target: {len(users)} users,")
    print(f"{int(n_train.sum())} train and {int(n_test.sum())} held-out tokens")
    print("| rule | projected job-seconds |\n| --- | ---: |")
    for rule, seconds in projected.items():
        print(f"| {rule} | {seconds:,.0f} |")
    print(f"| fit stage without the cross-user matrix | {sum(projected.values()):,.0f} |")
    paths = validation[all_tokens].groupby(["head", "d"])["seconds"].sum()
    refits = fits.groupby(["head", "d"])[arms].sum().sum(axis=1)
    print("\nms a train token, path and refit of every arm (validate and fit), per method:")
    print("| head | d | ms |\n| --- | ---: | ---: |")
    for (head, d), seconds in (paths.add(refits, fill_value=0) * 1e3 / train).items():
        print(f"| {head} | {d:g} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
