"""One thread for the training tests: on a shared 2-core machine two threads spin against each
other (a 20-step smoke run took 24 s with two, 0.8 s with one)."""

import pytest
import torch


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
