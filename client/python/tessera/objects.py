"""The objects encoding: non-tensor training state as tagged JSON, never pickle.

``Client.save(..., objects={name: value})`` stores each value as UTF-8 JSON (format
"tessera.objects/1") in a per-rank extra shard ``objects.<name>``; ``Client.load(...,
objects=True)`` decodes them. Decoding only builds the plain types below — it never imports,
calls or constructs anything named by the data, so loading a checkpoint cannot execute code.

Document: ``{"format": "tessera.objects/1", "value": V}`` where V encodes a value as:

=====================================  ======================================================
Python value                           JSON
=====================================  ======================================================
None, True/False, int, str             null, true/false, integer (any size), string
float (finite)                         number (repr round-trips exactly)
float nan / inf / -inf                 ``{"$float": "nan" | "inf" | "-inf"}``
list                                   array
tuple                                  ``{"$tuple": [V, ...]}``
dict with str keys not starting "$"    object ``{key: V}``
any other dict (int keys, ...)         ``{"$dict": [[K, V], ...]}`` (keys encoded like values)
bytes / bytearray                      ``{"$bytes": "<base64>"}`` (decoded as bytes)
torch.Tensor                           ``{"$tensor": {"dtype": "uint8", "shape": [...],
                                       "data": "<base64 of the raw little-endian bytes>"}}``
                                       (decoded on the CPU; as a numpy array without torch)
numpy.ndarray / numpy scalar           ``{"$ndarray": {"dtype": "<f4", "shape": [...],
                                       "data": "<base64>"}}`` (scalar: shape [] and
                                       ``"scalar": true``)
=====================================  ======================================================

This covers optimizer ``param_groups``, LR-scheduler ``state_dict()``s, ``torch.get_rng_state()``
(a uint8 tensor), ``numpy.random.get_state()``, ``random.getstate()``, data-loader positions and
step counters. Anything else (functions, arbitrary classes, object arrays) is refused with a
TypeError naming its path, e.g. ``objects['sched']['lr_lambdas'][0]``.
"""

import base64
import json
import math
import re

FORMAT = "tessera.objects/1"
_MAX_DEPTH = 200

__all__ = ["encode", "decode", "FORMAT"]


def _torch():
    try:
        import torch
    except ImportError:
        return None
    return torch


def _numpy():
    try:
        import numpy
    except ImportError:
        return None
    return numpy


def _b64(data):
    return base64.b64encode(data).decode("ascii")


def _tensor_bytes(t, torch):
    t = t.detach().to("cpu").contiguous()
    if t.numel() == 0:
        return b""
    return t.reshape(-1).view(torch.uint8).numpy().tobytes()


def _enc(value, path, depth):
    if depth > _MAX_DEPTH:
        raise TypeError("%s: nested deeper than %d levels" % (path, _MAX_DEPTH))
    if value is None or isinstance(value, (bool, str)):
        return value
    if isinstance(value, int):
        return int(value)
    if isinstance(value, float):
        if math.isnan(value):
            return {"$float": "nan"}
        if math.isinf(value):
            return {"$float": "inf" if value > 0 else "-inf"}
        return float(value)
    if isinstance(value, (bytes, bytearray)):
        return {"$bytes": _b64(bytes(value))}
    if isinstance(value, list):
        return [_enc(v, "%s[%d]" % (path, i), depth + 1) for i, v in enumerate(value)]
    if isinstance(value, tuple):
        return {"$tuple": [_enc(v, "%s[%d]" % (path, i), depth + 1) for i, v in enumerate(value)]}
    if isinstance(value, dict):
        if all(isinstance(k, str) and not k.startswith("$") for k in value):
            return {k: _enc(v, "%s[%r]" % (path, k), depth + 1) for k, v in value.items()}
        return {"$dict": [[_enc(k, "%s.<key %r>" % (path, k), depth + 1),
                           _enc(v, "%s[%r]" % (path, k), depth + 1)] for k, v in value.items()]}
    torch = _torch()
    if torch is not None and isinstance(value, torch.Tensor):
        if value.layout != torch.strided or value.is_quantized:
            raise TypeError("%s: cannot encode a %s tensor" % (path, value.layout))
        dtype = str(value.dtype).replace("torch.", "")
        return {"$tensor": {"dtype": dtype, "shape": list(value.shape),
                            "data": _b64(_tensor_bytes(value, torch))}}
    np = _numpy()
    if np is not None and isinstance(value, (np.ndarray, np.generic)):
        arr = np.asarray(value)
        if arr.dtype.hasobject or arr.dtype.fields is not None:
            raise TypeError("%s: cannot encode a numpy array of dtype %s" % (path, arr.dtype))
        out = {"dtype": arr.dtype.str, "shape": list(arr.shape),
               "data": _b64(np.ascontiguousarray(arr).tobytes())}
        if isinstance(value, np.generic):
            out["scalar"] = True
        return {"$ndarray": out}
    raise TypeError("%s: cannot encode a %s (only None, bool, int, float, str, bytes, list, "
                    "tuple, dict, torch.Tensor and numpy arrays; never pickle)"
                    % (path, type(value).__name__))


def encode(value, name="objects"):
    """The encoded bytes of `value`. Raises TypeError naming the path of an unsupported value."""
    doc = {"format": FORMAT, "value": _enc(value, name, 0)}
    return json.dumps(doc, separators=(",", ":"), allow_nan=False,
                      ensure_ascii=False).encode("utf-8")


_MAX_DIMS = 64
_MAX_ELEMENTS = 1 << 62


def _spec(obj, tag, path):
    """A $tensor's or $ndarray's fields, with its shape checked: a list of at most _MAX_DIMS
    non-negative ints whose product (and each one) stays below _MAX_ELEMENTS."""
    spec = obj[tag]
    if (not isinstance(spec, dict) or not isinstance(spec.get("dtype"), str)
            or not isinstance(spec.get("shape"), list) or not isinstance(spec.get("data"), str)):
        raise ValueError("%s: malformed %s" % (path, tag))
    shape = spec["shape"]
    elements = 1
    for d in shape:
        if type(d) is not int or d < 0 or d >= _MAX_ELEMENTS:
            raise ValueError("%s: %s shape %r has a dimension that is not an int in [0, 2^62)"
                             % (path, tag, shape))
        elements *= d
    if len(shape) > _MAX_DIMS or elements >= _MAX_ELEMENTS:
        raise ValueError("%s: %s shape %r is too large" % (path, tag, shape))
    return spec


def _data(spec, itemsize, what, path):
    """The spec's bytes, if they are exactly the shape's elements times `itemsize` — checked
    before anything is allocated for the shape, which the document only claims."""
    data = base64.b64decode(spec["data"], validate=True)
    nbytes = math.prod(spec["shape"]) * itemsize
    if len(data) != nbytes:
        raise ValueError("%s: %d bytes for a %s of shape %s (%d bytes)"
                         % (path, len(data), what, spec["shape"], nbytes))
    return data


def _list(value, tag, path):
    if not isinstance(value, list):
        raise ValueError("%s: %s holds a %s, not a list" % (path, tag, type(value).__name__))
    return value


def _dec(value, path, depth):
    if depth > _MAX_DEPTH:
        raise ValueError("%s: nested deeper than %d levels" % (path, _MAX_DEPTH))
    if isinstance(value, list):
        return [_dec(v, "%s[%d]" % (path, i), depth + 1) for i, v in enumerate(value)]
    if not isinstance(value, dict):
        return value
    tags = [k for k in value if k.startswith("$")]
    if not tags:
        return {k: _dec(v, "%s[%r]" % (path, k), depth + 1) for k, v in value.items()}
    if len(value) != 1:
        raise ValueError("%s: a tagged value has exactly one key, not %s" % (path, list(value)))
    tag = tags[0]
    if tag == "$float":
        if value[tag] not in ("nan", "inf", "-inf"):
            raise ValueError("%s: bad $float %r" % (path, value[tag]))
        return float(value[tag])
    if tag == "$bytes":
        if not isinstance(value[tag], str):
            raise ValueError("%s: $bytes holds no base64 string" % path)
        return base64.b64decode(value[tag], validate=True)
    if tag == "$tuple":
        return tuple(_dec(v, "%s[%d]" % (path, i), depth + 1)
                     for i, v in enumerate(_list(value[tag], tag, path)))
    if tag == "$dict":
        out = {}
        for item in _list(value[tag], tag, path):
            if not isinstance(item, list) or len(item) != 2:
                raise ValueError("%s: $dict items are [key, value] pairs" % path)
            key = _dec(item[0], path + ".<key>", depth + 1)
            try:
                hash(key)
            except TypeError:
                raise ValueError("%s: $dict key %r cannot be a key" % (path, key)) from None
            out[key] = _dec(item[1], "%s[%r]" % (path, key), depth + 1)
        return out
    if tag == "$tensor":
        spec = _spec(value, tag, path)
        torch = _torch()
        if torch is None:
            np = _numpy()
            return _ndarray(np, spec, path, "%s tensor" % spec["dtype"], _TORCH_DTYPE_NAME)
        dtype = getattr(torch, spec["dtype"], None)
        if not isinstance(dtype, torch.dtype) or dtype in _quantized(torch):
            raise ValueError("%s: unknown tensor dtype %r" % (path, spec["dtype"]))
        data = _data(spec, dtype.itemsize, "%s tensor" % spec["dtype"], path)
        try:  # the size is checked: what can fail now is a dtype torch cannot make on the CPU
            out = torch.empty(spec["shape"], dtype=dtype)
            if data:
                out.reshape(-1).view(torch.uint8).copy_(
                    torch.frombuffer(bytearray(data), dtype=torch.uint8))
        except (RuntimeError, TypeError) as e:
            raise ValueError("%s: cannot make a %s tensor: %s" % (path, spec["dtype"], e)) \
                from None
        return out
    if tag == "$ndarray":
        spec = _spec(value, tag, path)
        return _ndarray(_numpy(), spec, path, "numpy array")
    raise ValueError("%s: unknown tag %r" % (path, tag))


def _quantized(torch):
    return {getattr(torch, n) for n in ("qint8", "quint8", "qint32", "quint4x2", "quint2x4")
            if hasattr(torch, n)}


# What numpy's dtype.str looks like for the arrays `encode` takes ("<f4", "|u1", "<M8[ns]",
# "<U5"): numpy's dtype strings can say far more (comma lists, sub-arrays, parsed with
# ast.literal_eval), which a document has no business asking for.
_DTYPE_STR = re.compile(r"[<>|=]?[A-Za-z][0-9]{0,6}(\[[A-Za-z0-9]{1,3}\])?")
# A torch dtype's name ("float32", "bool"), which numpy reads too, for a tensor decoded
# without torch.
_TORCH_DTYPE_NAME = re.compile(r"[a-z]{1,10}[0-9]{0,3}")


def _ndarray(np, spec, path, what, dtype_pattern=_DTYPE_STR):
    try:
        if not dtype_pattern.fullmatch(spec["dtype"]):
            raise TypeError
        dtype = np.dtype(spec["dtype"])
    except TypeError:
        raise ValueError("%s: unknown dtype %r" % (path, spec["dtype"])) from None
    if dtype.hasobject:
        raise ValueError("%s: object arrays are never decoded" % path)
    if dtype.itemsize == 0:
        raise ValueError("%s: dtype %r has no size" % (path, spec["dtype"]))
    data = _data(spec, dtype.itemsize, what, path)
    arr = np.frombuffer(data, dtype=dtype).reshape(spec["shape"]).copy()
    return arr[()] if spec.get("scalar") else arr


def decode(data, name="objects"):
    """The value `encode` encoded. Raises ValueError for bytes that are not this format."""
    try:
        doc = json.loads(bytes(data).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise ValueError("%s: not a tessera objects document: %s" % (name, e)) from None
    except RecursionError:
        raise ValueError("%s: not a tessera objects document: nested too deeply" % name) \
            from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or "value" not in doc:
        raise ValueError("%s: not a %s document" % (name, FORMAT))
    return _dec(doc["value"], name, 0)
