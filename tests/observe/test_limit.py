"""The headline distance to the limit: MFU for a compute-bound run, the loader's share else."""

from __future__ import annotations

import dataclasses

from lightning_maxtp.observe import JobContext
from lightning_maxtp.observe.limit import distance
from lightning_maxtp.observe.report import ThroughputReport
from tests.observe.test_diagnosis import window

# 1 GFLOP per sample; 320 samples/s (10 steps of 32 in 100 ms each); a 1 TFLOP/s bf16 peak.
PEAKS = (("fp32", 0.5e12), ("bf16", 1e12))
BF16 = JobContext(precision="bf16-mixed", flops_per_sample=1e9, peaks=PEAKS, num_workers=4)


def test_a_compute_bound_run_is_at_its_mfu_of_the_dtype_in_force() -> None:
    limit = distance([window(100, 0, context=BF16)], "compute")
    assert limit is not None and limit.limit == "device"
    assert limit.share is not None and abs(limit.share - 0.32) < 1e-9
    assert limit.text == "at 32% of this device's measured bf16 peak"
    fp32 = dataclasses.replace(BF16, precision="32-true")
    limit = distance([window(100, 0, context=fp32)], "compute")
    assert limit is not None and limit.share is not None and abs(limit.share - 0.64) < 1e-9


def test_a_count_above_the_peak_is_an_error_with_both_numbers_never_above_100_percent() -> None:
    planted = dataclasses.replace(BF16, flops_per_sample=1e11)  # 32 TFLOP/s "achieved"
    w = window(100, 0, context=planted)
    limit = distance([w], "compute")
    assert limit is not None and limit.share is None
    assert "32.000 TFLOP/s counted is more than the measured bf16 peak of 1.000" in limit.text
    assert "%" not in limit.text
    assert w.utilization is not None and w.utilization.mfu is None
    assert "MFU ? (FLOP count above the bf16 peak)" in str(w)


def test_without_a_count_the_headline_says_how_to_give_one() -> None:
    limit = distance([window(100, 0)], "compute")
    assert limit is not None and limit.share is None and "flops_per_batch=" in limit.text
    assert distance([], "compute") is None


def test_a_data_bound_run_is_held_by_its_loader_at_a_share_of_the_device() -> None:
    # 4 workers: the job gets 32 per 100 ms = 320/s; the device alone 32 per 40 ms = 800/s.
    limit = distance([window(100, 60, context=BF16)], "data_pipeline")
    assert limit is not None and limit.limit == "loader"
    assert limit.text.startswith(
        "the loader gives 320 samples/s, the device could take 800: loading is the limit at 40%"
    )
    assert "(the device at 32% of its measured bf16 peak)" in limit.text


def test_the_report_states_the_distance_in_its_summary_markdown_and_json() -> None:
    report = ThroughputReport(windows=(window(100, 0, context=BF16),), diagnoses=())
    assert "limit: at 32% of this device's measured bf16 peak" in report.summary()
    assert "**Distance to the limit:** at 32% of" in report.to_markdown()
    assert "| 32% |" in report.to_markdown()  # the window's MFU column
    data = report.to_dict()
    assert abs(data["mfu"] - 0.32) < 1e-9 and data["limit"]["limit"] == "device"


def test_a_loader_fast_enough_alone_but_in_series_with_the_step_says_so() -> None:
    # 0 workers: 30 ms of loading then 70 ms of compute per 32 samples: the loader alone gives
    # 1,067/s, the device 457/s, together 320/s: at 70 % of the device's rate.
    serial = dataclasses.replace(BF16, num_workers=0, flops_per_sample=1e6)
    limit = distance([window(100, 30, context=serial)], "data_pipeline")
    assert limit is not None and limit.share is not None and abs(limit.share - 0.7) < 1e-9
    assert limit.text.startswith(
        "loading runs in series with the step: the loader alone gives 1,067 samples/s and the "
        "device could take 457, together 320: at 70% of the device's rate"
    )
    assert limit.text.endswith("(the device at 0.0% of its measured bf16 peak)")
