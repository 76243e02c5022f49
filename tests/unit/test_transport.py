"""Channel plumbing without Ray: array checks, transport choice, envelopes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pipeline.errors import InvalidInput, TransportError
from pipeline.transport.base import Envelope, check_array, choose_transport
from pipeline.transport.object_store import ObjectStoreReceiver


def test_check_array_names_what_no_transport_carries():
    assert check_array(np.zeros((2, 3), np.float16)) == ((2, 3), "float16")
    with pytest.raises(InvalidInput) as info:
        check_array(np.zeros((4, 4), np.float32)[:, ::2])
    assert "strides" in info.value.fields
    with pytest.raises(InvalidInput) as info:
        check_array(np.zeros(3, np.complex64))
    assert info.value.fields["dtype"] == "complex64"
    with pytest.raises(InvalidInput):
        check_array([1, 2, 3])


@pytest.mark.parametrize(
    "preferred, s, r, ok, expected",
    [
        ("auto", True, True, True, "nccl"),
        ("auto", True, True, False, "object_store"),
        ("auto", True, False, True, "object_store"),
        ("auto", False, False, True, "object_store"),
        ("object_store", True, True, True, "object_store"),
        ("nccl", True, True, True, "nccl"),
    ],
)
def test_choose_transport(preferred, s, r, ok, expected):
    assert choose_transport(preferred, s, r, nccl_ok=ok) == expected


def test_forced_transports_that_cannot_work_fail_clearly():
    with pytest.raises(TransportError) as info:
        choose_transport("nccl", True, False, nccl_ok=True)
    assert info.value.fields["receiver_cuda"] is False
    with pytest.raises(TransportError):
        choose_transport("nccl", True, True, nccl_ok=False)
    with pytest.raises(InvalidInput):
        choose_transport("carrier-pigeon", False, False)  # type: ignore[arg-type]


def test_envelopes_pickle_and_receivers_refuse_other_transports():
    env = Envelope("c", "nccl", 3, (2, 2), "float32", {"request_ids": ["a", "b"]}, None)
    back = pickle.loads(pickle.dumps(env))
    assert back == env and back.nbytes == 16
    with pytest.raises(TransportError):
        ObjectStoreReceiver("c").recv(env)


def test_nccl_dtype_table_refuses_what_nccl_cannot_carry():
    from pipeline.transport.base import DTYPES
    from pipeline.transport.nccl import NcclToken
    from pipeline.transport.nccl_link import NCCL_TYPES, nccl_type

    assert set(NCCL_TYPES) == set(DTYPES)
    for bad in ("int16", "complex64", "uint16"):
        with pytest.raises(InvalidInput) as info:
            nccl_type(bad)
        assert info.value.fields["dtype"] == bad and "float16" in info.value.fields["supported"]
    env = Envelope("c", "nccl", 3, (2, 2), "float16", {"k": 1}, NcclToken("a", "b", 4))
    back = pickle.loads(pickle.dumps(env))
    assert back.token == NcclToken("a", "b", 4) and back.nbytes == 8
