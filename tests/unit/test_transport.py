"""Channel plumbing without Ray: the local channel, array checks, transport choice, envelopes."""

from __future__ import annotations

import pickle

import numpy as np
import pytest

from pipeline.errors import InvalidInput, TransportError
from pipeline.transport.base import Envelope, check_array, choose_transport
from pipeline.transport.object_store import LocalChannel, ObjectStoreReceiver


def test_local_channel_hands_the_array_over_in_order():
    ch = LocalChannel("x")
    arrays = [np.arange(n, dtype=np.float32) for n in (1, 5, 9)]
    envs = [ch.send(a, {"i": i}) for i, a in enumerate(arrays)]
    assert [e.seq for e in envs] == [0, 1, 2]
    for i, e in enumerate(envs):
        got, meta = ch.recv(e)
        assert got is arrays[i] and meta == {"i": i}
    with pytest.raises(TransportError):
        ch.recv(envs[0])  # received twice


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
    "preferred, s, r, same, ok, expected",
    [
        ("auto", True, True, False, True, "nccl"),
        ("auto", True, True, False, False, "object_store"),
        ("auto", True, False, False, True, "object_store"),
        ("auto", False, False, False, True, "object_store"),
        ("auto", True, True, True, True, "local"),
        ("object_store", True, True, False, True, "object_store"),
        ("nccl", True, True, False, True, "nccl"),
    ],
)
def test_choose_transport(preferred, s, r, same, ok, expected):
    assert choose_transport(preferred, s, r, same_process=same, nccl_ok=ok) == expected


def test_forced_transports_that_cannot_work_fail_clearly():
    with pytest.raises(TransportError) as info:
        choose_transport("nccl", True, False, nccl_ok=True)
    assert info.value.fields["receiver_cuda"] is False
    with pytest.raises(TransportError):
        choose_transport("local", False, False, same_process=False)
    with pytest.raises(InvalidInput):
        choose_transport("carrier-pigeon", False, False)  # type: ignore[arg-type]


def test_envelopes_pickle_and_receivers_refuse_other_transports():
    env = Envelope("c", "local", 3, (2, 2), "float32", {"request_ids": ["a", "b"]}, 3)
    back = pickle.loads(pickle.dumps(env))
    assert back == env and back.nbytes == 16
    with pytest.raises(TransportError):
        ObjectStoreReceiver("c").recv(env)


def test_nccl_dtype_table_refuses_what_nccl_cannot_carry():
    from pipeline.transport.base import DTYPES
    from pipeline.transport.nccl import NCCL_TYPES, NcclToken, nccl_type

    assert set(NCCL_TYPES) == set(DTYPES)
    for bad in ("int16", "complex64", "uint16"):
        with pytest.raises(InvalidInput) as info:
            nccl_type(bad)
        assert info.value.fields["dtype"] == bad and "float16" in info.value.fields["supported"]
    env = Envelope("c", "nccl", 3, (2, 2), "float16", {"k": 1}, NcclToken("a", "b", 4))
    back = pickle.loads(pickle.dumps(env))
    assert back.token == NcclToken("a", "b", 4) and back.nbytes == 8
