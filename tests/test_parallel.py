"""Ranks analysed in threads, in worker processes or on a Dask cluster give exactly what one
thread of one process gives."""

import subprocess
import sys

import pytest
from click.testing import CliRunner
from conftest import DATA, messages

from tracekit.front.cli import main

RUN = DATA / "h200x2-small"
VERBS = [("summary", RUN / "fsdp2"), ("comms", RUN / "fsdp1"), ("syncs", RUN / "fsdp1"),
         ("diff", RUN / "fsdp1", RUN / "fsdp2")]


def output(*args, env=None):
    result = CliRunner(env=env).invoke(main, [*map(str, args), "--format", "json", "--no-cache"])
    assert result.exit_code == 0, result.output
    return result.stdout


@pytest.fixture(scope="module")
def cluster():
    import logging

    import distributed

    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None,
                                  silence_logs=logging.CRITICAL) as c:
        yield c.scheduler_address


@pytest.mark.parametrize("verb", VERBS, ids=lambda v: v[0])
def test_workers_and_a_dask_cluster_give_the_same_json(verb, cluster):
    one = output(*verb, "--workers", 1, env={"TRACEKIT_CORES": "1"})  # one thread
    assert output(*verb, "--workers", 1, env={"TRACEKIT_CORES": "4"}) == one  # four threads of this process
    assert output(*verb, "--workers", 2) == one
    assert output(*verb, "--scheduler", cluster) == one


def test_an_unreachable_scheduler_is_one_line(tmp_path):
    """Run as a user would (its own process: Dask's client keeps retrying in the background)."""
    result = subprocess.run([sys.executable, "-m", "tracekit", "summary", "--scheduler", "tcp://127.0.0.1:9",
                             str(RUN / "ddp")], capture_output=True, text=True, timeout=120)
    assert result.returncode == 2 and len(messages(result.stderr)) == 1
    assert result.stderr.startswith("tracekit: --scheduler tcp://127.0.0.1:9: cannot reach")


def slow_unless_first(item):
    """Item 0 fails at once; every other one takes a while and then leaves a mark."""
    import time

    index, folder = item
    if index == 0:
        raise ValueError("bad rank")
    time.sleep(0.5)
    (folder / f"done{index}").touch()


def test_a_failing_rank_cancels_the_others(tmp_path):
    """16 ranks on 2 workers, rank 0 bad: the error comes back without the other 15 done."""
    from tracekit.core.executor import Processes

    with pytest.raises(ValueError, match="bad rank"):
        Processes(2).map(slow_unless_first, [(i, tmp_path) for i in range(16)])
    assert len(list(tmp_path.iterdir())) < 15
