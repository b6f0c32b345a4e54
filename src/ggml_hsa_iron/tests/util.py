"""Helpers for the tests: requests built like the backend builds them."""

import json

from ggml_hsa_iron.request import Tensor, canonical_name


def tensor(dtype, ne):
    ne = tuple(ne) + (1,) * (4 - len(ne))
    return Tensor.dense(dtype, ne)


def request_dict(op, inputs, output, arch="aie2p", op_params=(), name=None, extra_outputs=()):
    def t(x):
        return {"type": x.dtype, "ne": list(x.ne), "nb": list(x.nb)}

    d = {
        "name": name or canonical_name(op, op_params, inputs, output, extra_outputs),
        "arch": arch,
        "op": op,
        "op_params": list(op_params),
        "inputs": [t(x) for x in inputs],
        "output": t(output),
    }
    if extra_outputs:
        d["extra_outputs"] = [t(x) for x in extra_outputs]
    return d


def request_json(*args, **kwargs):
    return json.dumps(request_dict(*args, **kwargs))
