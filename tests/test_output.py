from __future__ import annotations

import pytest

from fusecli.errors import FuseError
from fusecli.output import atomic_write, refuse_overwriting_input


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
