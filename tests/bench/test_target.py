"""TARGET parsing (pure) and loading a job function (in this process)."""

from __future__ import annotations

from pathlib import Path

import pytest
from torch.utils.data import DataLoader

from lightning_maxtp.bench import BenchJob, BenchTargetError
from lightning_maxtp.bench.target import as_job, check_function, load_job, parse_target
from tests.helpers.bench_jobs import ComputeNet

JOBS = Path(__file__).resolve().parents[1] / "helpers" / "bench_jobs.py"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("train.py", "must be FILE.py:FUNCTION or package.module:FUNCTION"),
        (":job", "must be FILE.py:FUNCTION"),
        ("train.py:", "must be FILE.py:FUNCTION"),
        ("nowhere/train.py:job", "no file 'nowhere/train.py'"),
        ("tests/helpers:job", "'tests/helpers' is not a .py file"),
        ("my-pkg.jobs:job", "is neither a .py file nor a module name"),
        (f"{JOBS}:not-a-name", "'not-a-name' is not a Python function name"),
    ],
)
def test_parse_target_names_what_is_wrong(text: str, message: str) -> None:
    with pytest.raises(BenchTargetError, match="TARGET") as err:
        parse_target(text)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_parse_target_reads_files_and_modules() -> None:
    target = parse_target(f"{JOBS}:job")
    assert target.path == JOBS and target.function == "job" and target.module is None
    target = parse_target("tests.helpers.bench_jobs:job")
    assert target.module == "tests.helpers.bench_jobs" and target.path is None


def test_load_job_from_a_file_and_from_a_module() -> None:
    for text in (f"{JOBS}:job", "tests.helpers.bench_jobs:job"):
        job = load_job(parse_target(text))
        # a file is imported as a module of its own, so its classes are copies: compare names
        assert isinstance(job, BenchJob) and type(job.model).__name__ == "ComputeNet"
        assert isinstance(job.train_dataloaders, DataLoader) and job.datamodule is None


def test_a_job_function_with_config_gets_the_configuration_name() -> None:
    target = parse_target(f"{JOBS}:job_with_configs")
    assert load_job(target, "narrow").model.net[0].out_features == 128
    assert load_job(target, "maxtp").model.net[0].out_features == 512
    with pytest.raises(ValueError, match="unknown config 'wide'"):
        load_job(target, "wide")  # the user's own error passes through


def test_a_named_config_needs_a_config_parameter() -> None:
    with pytest.raises(BenchTargetError, match=r"add `config: str` to job\(\)"):
        load_job(parse_target(f"{JOBS}:job"), "narrow")


@pytest.mark.parametrize(
    ("function", "message"),
    [
        ("missing", "missing does not exist in"),
        ("NOT_CALLABLE", "NOT_CALLABLE is not callable"),
        ("not_a_job", "returned list; return a dict"),
    ],
)
def test_load_job_rejects_what_is_not_a_job_function(function: str, message: str) -> None:
    with pytest.raises(BenchTargetError) as err:
        load_job(parse_target(f"{JOBS}:{function}"))
    assert message in str(err.value)


def test_a_raising_job_function_raises_its_own_error() -> None:
    with pytest.raises(FileNotFoundError, match=r"data/train\.csv"):
        load_job(parse_target(f"{JOBS}:raises"))


def test_as_job_checks_the_fields() -> None:
    loader = DataLoader(list(range(4)))
    assert as_job({"model": ComputeNet(), "train_dataloaders": loader}, "t").trainer_kwargs == {}
    cases = [
        ({"model": ComputeNet(), "train_dataloader": loader}, "key(s) ['train_dataloader']"),
        ({"train_dataloaders": loader}, "without 'model'"),
        ({"model": object(), "train_dataloaders": loader}, "not a LightningModule"),
        ({"model": ComputeNet()}, "exactly one of 'datamodule' and 'train_dataloaders'"),
        ({"model": ComputeNet(), "datamodule": 1, "train_dataloaders": loader}, "exactly one"),
        ({"model": ComputeNet(), "train_dataloaders": loader, "trainer_kwargs": [1]}, "not a dict"),
    ]
    for value, message in cases:
        with pytest.raises(BenchTargetError) as err:
            as_job(value, "t")
        assert message in str(err.value)


def test_a_function_object_names_its_module() -> None:
    from lightning_maxtp.bench.run import _target_text
    from tests.helpers import bench_jobs

    assert _target_text(bench_jobs.job) == "tests.helpers.bench_jobs:job"
    assert _target_text("a.py:f") == "a.py:f"
    with pytest.raises(BenchTargetError, match="must be a module-level function"):
        _target_text(lambda: None)


def test_a_job_on_several_devices_is_refused_before_it_trains(tmp_path: Path) -> None:
    from lightning_maxtp.bench.child import fit_once

    job = BenchJob(ComputeNet(), train_dataloaders=DataLoader(list(range(4))),
                   trainer_kwargs={"accelerator": "cpu", "devices": 2})  # fmt: skip
    with pytest.raises(BenchTargetError, match=r"make 2 processes .*set it to 1"):
        fit_once(job, "defaults", steps=5, warmup=1, accelerator=None, root_dir=str(tmp_path))


def test_check_function_reads_the_file_without_importing_it() -> None:
    target = parse_target(f"{JOBS}:job")
    check_function(target, ("defaults", "maxtp"))
    check_function(parse_target(f"{JOBS}:job_with_configs"), ("narrow",))
    check_function(parse_target(f"{JOBS}:NOT_CALLABLE"), ("defaults",))  # the child says more
    with pytest.raises(BenchTargetError, match="missing does not exist in"):
        check_function(parse_target(f"{JOBS}:missing"), ("defaults",))
    with pytest.raises(BenchTargetError, match=r"add `config: str` to job\(\)"):
        check_function(target, ("defaults", "bf16"))


def test_the_job_s_logging_and_checkpoint_callbacks_are_dropped(tmp_path: Path) -> None:
    from lightning.pytorch.callbacks import LearningRateMonitor, ModelCheckpoint

    from lightning_maxtp.bench.child import fit_once
    from tests.helpers.bench_jobs import _loader

    callbacks = [ModelCheckpoint(), LearningRateMonitor()]
    job = BenchJob(ComputeNet(64), train_dataloaders=_loader(8), trainer_kwargs={
        "accelerator": "cpu", "callbacks": callbacks, "accumulate_grad_batches": 2,
        "max_epochs": 3, "logger": True})  # fmt: skip
    record = fit_once(job, "defaults", steps=6, warmup=2, accelerator=None, root_dir=str(tmp_path))
    assert record["dropped_callbacks"] == ["ModelCheckpoint", "LearningRateMonitor"]
    assert record["replaced_trainer_kwargs"] == ["logger", "max_epochs"]
    # batches are counted, although max_steps counts optimizer steps (2 batches each)
    assert record["steady_samples"] == 6 * 8 and record["fit_samples"] == 8 * 8
    assert record["reference_samples_per_s"] > 0 and record["tuning"] is None
