"""gpuir.qrels: the one qrels reader (gpuir parity and the BEIR loader both use it)."""

import pytest

from gpuir.qrels import read_qrels


def test_trec_and_beir_lines(tmp_path):
    trec = tmp_path / "t.txt"
    trec.write_text("q1 0 d1 1\nq1 0 d2 2\n\nq2 0 d3 0\n")
    assert read_qrels(trec) == {"q1": {"d1": 1, "d2": 2}, "q2": {"d3": 0}}
    beir = tmp_path / "b.tsv"
    beir.write_text("query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\t2.0\n")
    assert read_qrels(beir) == {"q1": {"d1": 1, "d2": 2}}


def test_tabs_keep_ids_with_spaces_and_a_bom_is_ignored(tmp_path):
    p = tmp_path / "q.tsv"
    p.write_bytes("\ufeffq 1\tdoc a\t1\n".encode())
    assert read_qrels(p) == {"q 1": {"doc a": 1}}


def test_the_last_grade_of_a_repeated_pair_wins(tmp_path):
    p = tmp_path / "q.txt"
    p.write_text("q1 0 d1 1\nq1 0 d1 3\n")
    assert read_qrels(p) == {"q1": {"d1": 3}}


@pytest.mark.parametrize("content, where", [("q1 d1\n", "bad:1"), ("q1 0 d1 1\nq1 d2 x\n", "bad:2"),
                                            ("q1 0 d1 1\nq1 0 d2 nan\n", "bad:2"), ("a b c d e\n", "bad:1")])
def test_bad_lines_name_file_and_line(tmp_path, content, where):
    p = tmp_path / "bad"
    p.write_text(content)
    with pytest.raises(ValueError, match=where):
        read_qrels(p)


def test_not_utf8_names_the_line(tmp_path):
    p = tmp_path / "bad"
    p.write_bytes(b"q1 0 d1 1\nq\xff 0 d 1\n")
    with pytest.raises(ValueError, match="bad:2: not valid UTF-8"):
        read_qrels(p)


def test_parity_and_the_beir_loader_share_the_reader():
    from gpuir import parity
    from gpuir.eval import datasets

    assert parity.read_qrels is read_qrels and datasets.read_qrels is read_qrels
