"""Jobs files of ``maxtp pack``: text, JSON, YAML, and clear errors for bad input."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from lightning_maxtp.pack import JobSpec, load_jobs, parse_jobs


def test_text_file_one_command_per_line(tmp_path: Path) -> None:
    path = tmp_path / "jobs.txt"
    path.write_text("# seeds\npython train.py --seed 1\n\n  python train.py --seed 2 | tee x\n")
    jobs = load_jobs(path)
    assert [(j.name, j.command, j.where) for j in jobs] == [
        ("job1", "python train.py --seed 1", f"{path} line 2"),
        ("job2", "python train.py --seed 2 | tee x", f"{path} line 4"),
    ]
    assert all(j.shell for j in jobs)


def test_json_jobs_with_every_field(tmp_path: Path) -> None:
    path = tmp_path / "jobs.json"
    path.write_text(
        '{"jobs": ["echo a", {"command": ["python", "-V"], "name": "ver", "gpu_memory_gib": 12,'
        ' "cpu_threads": 2, "memory_gib": 3.5, "cwd": "/tmp", "env": {"SEED": "7"},'
        ' "retries": 2}]}'
    )
    a, ver = load_jobs(path)
    assert (a.name, a.command, a.gpu_memory_gib, a.retries) == ("job1", "echo a", None, 0)
    assert ver == JobSpec(("python", "-V"), name="ver", gpu_memory_gib=12, cpu_threads=2,
                          memory_gib=3.5, cwd="/tmp", env={"SEED": "7"}, retries=2,
                          where=f"{path} job 2 (ver)")  # fmt: skip
    assert not ver.shell and ver.command_text == "python -V"


def test_json_sniffed_without_extension(tmp_path: Path) -> None:
    path = tmp_path / "jobs"
    path.write_text('["echo 1", "echo 2"]')
    assert [j.command for j in load_jobs(path)] == ["echo 1", "echo 2"]


@pytest.mark.parametrize(
    ("text", "kind", "match"),
    [
        ("", "text", r"src: no jobs found \(the file is empty or only has comments\)"),
        ("# only\n\n", "text", "no jobs found"),
        ("[]", "json", "no jobs found"),
        ('[{"command": "x", "gpu_mem": 3}]', "json",
         r"src job 1: unknown field 'gpu_mem'; did you mean 'gpu_memory_gib'\? known fields: "
         "command, name"),
        ('[{"name": "a"}]', "json", r"src job 1: missing field 'command'"),
        ('[{"command": "x", "gpu_memory_gib": -2}]', "json",
         r"src job 1 \(job1\): `gpu_memory_gib` must be a number of GiB > 0, got -2"),
        ('[{"command": "x", "cpu_threads": 1.5}]', "json", r"`cpu_threads` must be an integer"),
        ('[{"command": "x", "env": {"SEED": 1}}]', "json", r"`env` must map names to strings"),
        ('[{"command": "x", "retries": -1}]', "json",
         r"`retries` must be an integer >= 0, got -1; e.g. retries=1"),
        ('[{"command": "x", "retries": true}]', "json", r"`retries` must be an integer >= 0"),
        ('[{"command": ""}]', "json", r"`command` is empty"),
        ('[{"command": "a", "name": "x"}, {"command": "b", "name": "x"}]', "json",
         r"job names must be unique .* got 'x' more than once"),
        ("[1]", "json", r"src job 1: a job must be a command string or an object"),
        ('{"command": "a"}', "json", r"expected a list of jobs"),
        ("[", "json", r"src: not valid JSON at line 1 column 2"),
        ("echo", "toml", r"`kind` must be one of \('text', 'json', 'yaml'\), got 'toml'"),
    ],
)  # fmt: skip
def test_bad_input_names_the_job_field_and_fix(text: str, kind: str, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        parse_jobs(text, kind=kind, source="src")


def test_missing_file(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"jobs file '.*nope.txt' cannot be read"):
        load_jobs(tmp_path / "nope.txt")


def test_yaml_needs_pyyaml_or_says_so(tmp_path: Path) -> None:
    path = tmp_path / "jobs.yaml"
    path.write_text("- echo a\n- command: echo b\n  name: b\n")
    if importlib.util.find_spec("yaml") is None:
        with pytest.raises(ValueError, match=r"reading YAML needs PyYAML.*pip install pyyaml"):
            load_jobs(path)
    else:
        assert [j.name for j in load_jobs(path)] == ["job1", "b"]
