from __future__ import annotations

import pytest

from fusecli.core.errors import FuseError
from fusecli.core.output import atomic_write, refuse_overwriting_input


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_interrupted_write_leaves_the_old_file_and_no_partial(tmp_path, error):
    target = tmp_path / "out.svg"
    target.write_bytes(b"old")
    with pytest.raises(error), atomic_write(str(target)) as f:
        f.write(b"half of the new")
        raise error()
    assert target.read_bytes() == b"old"
    assert [p.name for p in tmp_path.iterdir()] == ["out.svg"]


def test_completed_write_replaces_whole_with_normal_permissions(tmp_path):
    target = tmp_path / "out.svg"
    with atomic_write(str(target)) as f:
        f.write(b"new")
    assert target.read_bytes() == b"new" and (target.stat().st_mode & 0o044) == 0o044


def test_missing_folder_and_input_as_output_are_refused(tmp_path):
    with pytest.raises(FuseError, match="does not exist"), atomic_write(str(tmp_path / "no" / "x.svg")):
        pass
    model = tmp_path / "m.onnx"
    model.write_bytes(b"model")
    with pytest.raises(FuseError, match="overwrite the input"):
        refuse_overwriting_input(str(tmp_path / "." / "m.onnx"), [str(model)])
    refuse_overwriting_input(str(tmp_path / "other.onnx"), [str(model)])


def test_temp_names_carry_the_pid_and_stale_ones_are_removed(tmp_path):
    from fusecli.core.output import PART_PREFIX, SCRATCH_PREFIX, remove_stale, scratch_dir

    dead = 2**22 + 1  # above Linux's largest pid
    (tmp_path / f"{PART_PREFIX}{dead}-x.part").write_bytes(b"x")
    (tmp_path / f"{SCRATCH_PREFIX}{dead}-rewrite-y").mkdir()
    (tmp_path / "unrelated.part").write_bytes(b"keep")
    assert remove_stale(str(tmp_path)) == [f"{PART_PREFIX}{dead}-x.part"]
    assert remove_stale(str(tmp_path), SCRATCH_PREFIX) == [f"{SCRATCH_PREFIX}{dead}-rewrite-y"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["unrelated.part"]
    with scratch_dir("test") as d:
        assert f"{SCRATCH_PREFIX}{__import__('os').getpid()}-test-" in d
    assert not __import__("os").path.exists(d)


def test_check_output_formats_and_folders(tmp_path):
    import click

    from fusecli.core.output import check_output

    assert check_output(str(tmp_path / "a.PNG"), [], ("png",)) == "png"
    with pytest.raises(click.BadParameter, match=r"must end in \.onnx"):
        check_output(str(tmp_path / "a.txt"), [], ("onnx",))
    with pytest.raises(FuseError, match="is a folder"):
        check_output(str(tmp_path), [], ("onnx",))
