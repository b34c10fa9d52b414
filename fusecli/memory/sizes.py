"""Sizes: dims as integer polynomials in the model's input dims, and the one value that binds them.

A tensor dim is an ``int``, a ``str`` expression over named dims (``batch``, ``2*seq``, ``batch*seq``,
``seq + 1``), or ``None`` (unknown). ``Sizes`` maps every named dim to the value used for it and answers
"how many bytes is this tensor" (``None`` when a dim is unknown: never a guess) and "as which polynomial
in the input dims" for every pass, so that memory totals can be reported as formulas.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from functools import cache

from ..core.dims import Poly, dim_poly, dim_value
from ..core.ir import Tensor, dtype_size, shape_bytes


class Sizes(Mapping[str, int]):
    """The values of every named dim (the user's, defaults, and dims resolved by the shape tools), and
    the byte size of any tensor at those values, as a number and as a polynomial in ``variables``."""

    def __init__(self, values: Mapping[str, int] | None = None, variables: Iterable[str] = (),
                 batch: int | None = None, opaque: Mapping[str, int] | None = None) -> None:
        self._values = dict(values or {})
        self.variables = tuple(variables)  # the model's input dims, in the order they first appear
        self.batch = batch  # the value of the model's batch dims (None: it has none)
        self.opaque = dict(opaque or {})  # dims the shape tools could size only as numbers: unk1, ...
        self._bytes: dict[tuple, int | None] = {}  # (shape, dtype) -> bytes at these values

    def __getitem__(self, key: str) -> int:
        return self._values[key]

    def get(self, key: str, default=None):
        return self._values.get(key, default)  # Mapping's own goes through __getitem__ and a raise

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Sizes({self._values}, variables={self.variables})"

    def shape(self, t: Tensor) -> tuple[int, ...] | None:
        """Concrete dims of ``t``, or None when its rank or a dim is unknown."""
        if t.shape is None:
            return None
        out = []
        for d in t.shape:
            v = dim_value(d, self._values)
            if v is None:
                return None
            out.append(v)
        return tuple(out)

    def nbytes(self, t: Tensor) -> int | None:
        return None if t.shape is None else self.shape_bytes(t.shape, t.dtype)

    def shape_bytes(self, shape: tuple, dtype: str) -> int | None:
        """Bytes of a ``dtype`` tensor of ``shape`` at these values, worked out once per distinct pair."""
        key = (shape, dtype)
        try:
            return self._bytes[key]
        except KeyError:
            n = self._bytes[key] = shape_bytes(shape, dtype, self._values)
            return n
        except TypeError:  # an unhashable shape (a list): not kept
            return shape_bytes(shape, dtype, self._values)

    def formula(self, t: Tensor) -> Poly | None:
        """The tensor's bytes as a polynomial (symbols are input dims, or opaque dims the tools could only
        size as numbers); None when its rank or a dim is unknown."""
        return tensor_formula(t.shape, t.dtype)


@cache
def tensor_formula(shape, dtype: str) -> Poly | None:
    if shape is None:
        return None
    out = Poly.const(dtype_size(dtype))
    for d in shape:
        p = dim_poly(d)
        if p is None:
            return None
        out = out * p
    return out


def total_formula(tensors: Iterable[Tensor]) -> tuple[Poly, int]:
    """Sum of the byte polynomials of ``tensors``, and how many were left out (unknown rank or dim)."""
    total, missing = Poly(), 0
    for t in tensors:
        f = tensor_formula(t.shape, t.dtype)
        if f is None:
            missing += 1
        else:
            total = total + f
    return total, missing


def model_variables(graph) -> tuple[list[str], list[str]]:
    """The graph inputs' named dims (identifiers inside expressions such as ``2*seq``), in order of first
    appearance, and which of them are batch dims (a bare name on an input's first axis). Input dims with
    neither a size nor a name are named here (``batch`` on axis 0, ``<input>_dim<k>`` elsewhere)."""
    variables: list[str] = []
    batch: list[str] = []
    for t in graph.inputs:
        if t.shape is None:
            continue
        dims = list(t.shape)
        for axis, d in enumerate(dims):
            if d is None:
                d = dims[axis] = input_dim_name(t.name, axis)
            if isinstance(d, int):
                continue
            p = dim_poly(d)
            names = sorted(p.symbols()) if p is not None else [d]
            for n in names:
                if n not in variables:
                    variables.append(n)
            if axis == 0 and p is not None and p.terms == Poly.var(names[0]).terms and names[0] not in batch:
                batch.append(names[0])
        t.shape = tuple(dims)
    return variables, batch


def bind(graph, batch: int | None, dims: Mapping[str, int]) -> tuple[Sizes, list[str]]:
    """The user's --batch and --dim values checked against the model's dims; every dim not given is 1,
    said in the returned warnings. UsageError for a dim the model lacks or a --batch / --dim clash."""
    from ..core.errors import UsageError

    variables, batch_dims = model_variables(graph)
    unknown = [n for n in dims if n not in variables]
    if unknown:
        have = ", ".join(variables) if variables else "none: every input dim is fixed"
        raise UsageError(f"--dim {unknown[0]}: the model has no dim of that name (its dims: {have})")
    values: dict[str, int] = {}
    warnings: list[str] = []
    for n in batch_dims:
        if batch is not None and n in dims and dims[n] != batch:
            raise UsageError(f"--batch {batch} and --dim {n}={dims[n]} disagree: {n} is the model's "
                             "batch dim; give one of them")
        if batch is not None:
            values[n] = batch
    if batch is not None and not batch_dims:
        warnings.append(f"--batch {batch} has no effect: no graph input has a dynamic first dim")
    values.update(dims)
    defaulted = [n for n in variables if n not in values]
    for n in defaulted:
        values[n] = 1
    if defaulted:
        hints = ("--batch N" if n in batch_dims else f"--dim {n}=VALUE" for n in defaulted)
        hint = " ".join(dict.fromkeys(hints))  # several batch dims: one --batch N sets them all
        warnings.append(f"dims not given are taken as 1: {', '.join(f'{n}=1' for n in defaulted)} "
                        f"(set {hint})")
    used_batch = next((values[n] for n in batch_dims), batch)
    return Sizes(values, variables, used_batch), warnings


def input_dim_name(input_name: str, axis: int) -> str:
    """The name fusecli gives a graph input's dim that has neither a size nor a name."""
    return "batch" if axis == 0 else f"{_ident(input_name)}_dim{axis}"


def _ident(name: str) -> str:
    out = "".join(c if c.isalnum() or c == "_" else "_" for c in name) or "input"
    return out if not out[0].isdigit() else "_" + out
