"""Shared fixtures: tiny real models (random weights, real architectures) materialized on disk."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent
SNAKEMAKE = str(Path(sys.executable).with_name("snakemake"))


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny tensors: one torch thread is fastest, and two spin against each other on a busy 2-core machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    """A function arch -> folder of a materialized tiny random model ('llama' or 'gpt2')."""
    from uph.models import materialize

    made = {}

    def make(arch: str) -> Path:
        if arch not in made:
            folder = tmp_path_factory.mktemp(f"tiny-{arch}")
            materialize(f"tiny-{arch}", f"tiny:{arch}", folder)
            made[arch] = folder
        return made[arch]

    return make
