"""`benchmarks/ncu_summary.py` on a CSV shaped like Nsight Compute's --csv output."""

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

import ncu_summary  # noqa: E402

pytestmark = pytest.mark.quick  # scripts/test.sh --quick

HEADER = ('"ID","Process ID","Process Name","Host Name","Kernel Name","Context","Stream","Block Size","Grid Size",'
          '"Device","CC","Section Name","Metric Name","Metric Unit","Metric Value"')


def _row(i, name, unit, value):
    return (f'"{i}","1","dflash_runner","h","{name}","1","7","(128, 1, 1)","(64, 1, 1)","0","9.0","Command line",'
            f'"gpu__time_duration.sum","{unit}","{value}"')


def test_kernels_group_by_kind_and_rank_by_time(tmp_path):
    path = tmp_path / "ncu.csv"
    path.write_text("\n".join([
        "==PROF== Connected to process 1", HEADER,
        _row(0, "triton_tem_fused_mm_0", "usecond", "1,500.00"),
        _row(1, "triton_tem_fused_mm_1", "usecond", "500"),
        _row(2, "triton_poi_fused_add_2", "nsecond", "2000"),
        _row(3, "cached_attention_kernel", "usecond", "100"),
        _row(4, "void at::native::reduce_kernel<512, 1>(float)", "msecond", "0.1"),
    ]) + "\n")
    lines = ncu_summary.summary(ncu_summary.read(path), top=3)
    assert lines[0] == "5 launches, 2.20 ms of kernel time"
    table = [line.split("|")[1:-1] for line in lines if line.startswith("| ") and "---" not in line][1:]
    assert [(r[0].strip(), r[1].strip(), r[2].strip()) for r in table] == [
        ("GEMM template (Inductor)", "2", "2.000"), ("cached_attention_kernel", "1", "0.100"),
        ("void at::native::reduce_kernel", "1", "0.100"), ("(1 more groups)", "1", "0.002")]


def test_a_file_without_the_header_is_named(tmp_path):
    path = tmp_path / "x.csv"
    path.write_text("no csv here\n")
    with pytest.raises(SystemExit, match="no ncu CSV header"):
        ncu_summary.read(path)


def test_the_last_launches_one_by_one_in_order(tmp_path, capsys):
    path = tmp_path / "ncu.csv"
    path.write_text("\n".join([HEADER, _row(0, "verify_rows_kernel", "usecond", "98"),
                               _row(1, "verify_filtered_kernel", "usecond", "1,212.5"),
                               _row(2, "verify_accept_kernel", "nsecond", "4400")]) + "\n")
    assert ncu_summary.main([str(path), "--last", "2"]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[2:4] == ["| verify_filtered_kernel | (64, 1, 1) | (128, 1, 1) | 1212.5 |",
                          "| verify_accept_kernel | (64, 1, 1) | (128, 1, 1) | 4.4 |"]


def test_calls_split_at_each_methods_last_launch_and_break_down_by_part(tmp_path):
    """draft_forward ends at the drafts' argmax, target_verify at the accept launch; each call's
    time by GEMMs, attention (both kernels), heads and the rest; launches after the last call named."""
    path = tmp_path / "ncu.csv"
    names = [("triton_tem_fused_mm_0", 300), ("cached_attention_kernel", 100), ("greedy_rows_kernel", 50),
             ("triton_red_fused_rsqrt_1", 10), ("sm90_xmma_gemm_bf16", 600), ("cached_attention_kernel", 200),
             ("combine_kernel", 20), ("verify_rows_kernel", 30), ("verify_accept_kernel", 5),
             ("triton_poi_fused_add_2", 7)]
    path.write_text("\n".join([HEADER] + [_row(i, n, "usecond", us) for i, (n, us) in enumerate(names)]) + "\n")
    lines = ncu_summary.calls(ncu_summary.read(path))
    assert lines[2] == "| 1 | draft_forward | 3 | 450 | 300 (67%) | 100 (22%) | 50 (11%) | 0 (0%) |"
    assert lines[3] == "| 2 | target_verify | 6 | 865 | 600 (69%) | 220 (25%) | 35 (4%) | 10 (1%) |"
    assert lines[4] == "(after the last call: 1 launches, 7 us)"
    path.write_text("\n".join([HEADER, _row(0, "triton_tem_fused_mm_0", "usecond", 1)]) + "\n")
    with pytest.raises(SystemExit, match="no method call found"):
        ncu_summary.calls(ncu_summary.read(path))
