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


# --- the check before a model file replaces its target ----------------------------------------------------
def _model(nodes, outputs=None, domains=()) -> bytes:
    """x -> nodes -> y (float [2]), serialized."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])
    outputs = outputs if outputs is not None else [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2])]
    graph = helper.make_graph(nodes, "g", [x], outputs)
    opsets = [helper.make_opsetid("", 17), *(helper.make_opsetid(d, 1) for d in domains)]
    return helper.make_model(graph, opset_imports=opsets, ir_version=8).SerializeToString()


def _relu():
    from onnx import helper

    return [helper.make_node("Relu", ["x"], ["y"], "relu")]


def test_a_refusing_check_leaves_the_old_file_and_no_part(tmp_path):
    target = tmp_path / "out.onnx"
    target.write_bytes(b"old")
    seen = []

    def refuse(written, path):
        seen.append((open(written, "rb").read(), path))
        raise FuseError("refused")

    with pytest.raises(FuseError, match="refused"), atomic_write(str(target), check=refuse) as f:
        f.write(b"new")
    assert seen == [(b"new", str(target))]  # the check read the whole written part
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["out.onnx"]


def test_check_model_file_passes_a_good_model_and_names_the_checkers_complaint(tmp_path):
    from onnx import helper

    from fusecli.core.output import check_model_file

    good = tmp_path / "good.onnx"
    good.write_bytes(_model(_relu()))
    check_model_file(str(good), "out.onnx")
    bad = tmp_path / "bad.onnx"  # a node listed before the node making its input
    bad.write_bytes(_model([helper.make_node("Neg", ["a"], ["y"], "neg"),
                            helper.make_node("Relu", ["x"], ["a"])]))
    with pytest.raises(FuseError, match=r"^out\.onnx: the model fails onnx's checker "
                                        r"\(.*topologically sorted.*\); nothing written$"):
        check_model_file(str(bad), "out.onnx")


def test_check_model_file_asks_onnxruntime_when_the_checker_cannot_tell(tmp_path):
    """A custom domain's op passes onnx's checker; onnxruntime has no kernel for it."""
    from onnx import helper

    from fusecli.core.output import check_model_file

    odd = tmp_path / "odd.onnx"
    odd_op = helper.make_node("NoSuchOp", ["x"], ["y"], domain="custom.ops")
    odd.write_bytes(_model([odd_op], domains=["custom.ops"]))
    with pytest.raises(FuseError, match=r"^out\.onnx: onnxruntime cannot load the model \(.*NoSuchOp.*\); "
                                        r"nothing written$"):
        check_model_file(str(odd), "out.onnx")
    check_model_file(str(odd), "out.onnx", original=str(odd))  # the input's own: not fusecli's doing


def test_check_model_file_leaves_what_the_input_has_and_ort_only_ops_to_onnxruntime(tmp_path):
    from onnx import TensorProto, helper

    from fusecli.core.output import check_model_file

    shapeless = tmp_path / "shapeless.onnx"  # a graph output of unknown rank: the checker wants a shape
    shapeless.write_bytes(_model(_relu(), [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)]))
    with pytest.raises(FuseError, match="Field 'shape' of 'type' is required"):
        check_model_file(str(shapeless), "out.onnx")
    check_model_file(str(shapeless), "out.onnx", original=str(shapeless))
    rms = tmp_path / "rms.onnx"  # onnxruntime registers SimplifiedLayerNormalization in the ONNX domain
    g = helper.make_graph([helper.make_node("SimplifiedLayerNormalization", ["x", "g"], ["y"], axis=-1)], "g",
                          [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 4])],
                          [helper.make_tensor("g", TensorProto.FLOAT, [4], [1.0] * 4)])
    rms.write_bytes(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
                    .SerializeToString())
    check_model_file(str(rms), "out.onnx")
