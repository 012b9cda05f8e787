"""The sending side of verl's weight sync into vLLM, bounded on every device (cuda and cpu alike).

verl 0.9.1 syncs the trained weights into each vLLM server from the FSDP worker that shares its GPU:
`vLLMAsyncRollout.update_weights` (verl.workers.rollout.vllm_rollout.vllm_rollout) asks the vLLM worker to run
`update_weights_from_ipc` and then sends the weights itself with a `BucketedWeightSender` over a ZMQ REQ socket
(`ipc:///tmp/rl-colocate-zmq-<job>-replica-<r>-rank-<k>.sock`): a handshake (a CUDA IPC handle of the bucket on
GPU, a /dev/shm segment's name without IPC), then one message per bucket, each answered by the receiver. A REQ
socket blocks in `send` until a peer connects and in `recv` until it answers; verl waits in both with no timeout,
and the sender runs synchronously inside the FSDP worker's event loop. A vLLM worker that died, or raised while
loading a bucket, therefore leaves its FSDP rank blocked forever, and with it the step (the other ranks wait in
their next collective). This module makes those waits raise `WeightSyncError` instead.

Like the adapter, this module touches verl's private API (tests/engines/test_verl_adapter.py lists it); the rows
to re-check when verl is upgraded:

what                       where in verl 0.9.1  ->  why
-------------------------  --------------------------------------------------------------------------------
`BucketedWeightSender.`    the socket's `send`/`recv` wait forever  -> both poll and raise `WeightSyncError`
`_init_socket`             after `WEIGHT_SYNC_ACK_TIMEOUT_S` (`SEAL_WEIGHT_SYNC_TIMEOUT_S` overrides)
`BucketedWeightSender.`    without CUDA IPC (CPU, NPU) the new /dev/shm bucket stays in a local until the
`_init_buffer`             receiver answers, so a handshake that raises leaked it  -> owned by the sender at
                           once (its `_cleanup` unlinks it); with CUDA IPC verl's own method runs

Installed by the verl plugin in every verl process, whatever the device, once
`verl.workers.rollout.vllm_rollout.bucketed_weight_transfer` is imported (`bound_weight_sync`). It imports
nothing of verl but that module (a hook runs inside verl's import of its vLLM rollout package), so it does not
check verl's version itself: the launcher checks it before Ray starts (`seal.engines.verl.launch.train` imports
the adapter); `bound_weight_sync` checks the one thing it relies on, the socket verl's `_init_socket` opens.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from seal.io_utils import seconds_from_env

log = logging.getLogger(__name__)

TRANSFER_MODULE = "verl.workers.rollout.vllm_rollout.bucketed_weight_transfer"

# How long verl's weight sender waits for the vLLM worker to connect or to take a bucket before it gives up: a hang
# guard (a dead or failed receiver never answers). A bucket's load takes seconds (CPU: 256 MB buckets of a 135M
# model; GPU: 2 GB buckets of a 7B model copied over NVLink/PCIe), the receiver's start at most a minute; ten
# minutes is far above either, and still an error within the hour instead of a run that never ends.
WEIGHT_SYNC_ACK_TIMEOUT_S = 600.0
WEIGHT_SYNC_TIMEOUT_ENV = "SEAL_WEIGHT_SYNC_TIMEOUT_S"  # the knob (seconds); the failure tests set it low
POLL_MS = 1000  # one poll of the socket: how often the bound is checked


class WeightSyncError(RuntimeError):
    """verl's weight sync into vLLM failed: the vLLM worker did not connect or did not take the weights."""


def weight_sync_timeout_s() -> float:
    """The bound in seconds: `SEAL_WEIGHT_SYNC_TIMEOUT_S` when set (a positive number), `WEIGHT_SYNC_ACK_TIMEOUT_S`
    otherwise."""
    return seconds_from_env(WEIGHT_SYNC_TIMEOUT_ENV, WEIGHT_SYNC_ACK_TIMEOUT_S, "weight-sync")


def bound_weight_sync() -> None:
    """Both patches of the module table on verl's `BucketedWeightSender` (idempotent). Run by the plugin's
    post-import hook on `TRANSFER_MODULE`, in every verl process, on every device."""
    # Also while the hook runs, inside verl's import of the package (Python finds the module in sys.modules).
    from verl.workers.rollout.vllm_rollout import bucketed_weight_transfer as transfer

    if getattr(transfer.BucketedWeightSender._init_socket, "_seal_bound", False):
        return
    bound_the_sender_waits(transfer)
    sender_owns_its_segment(transfer)


def _bounded(socket: Any, event: int, call: Any, handle: str, what: str) -> Any:
    """`call` (the socket's `send` or `recv`) once `socket` polls ready for `event`; `WeightSyncError` naming the
    peer (the ZMQ address), the bound and its knob when it has not within the bound."""

    def wait_then_call(*args: Any, **kwargs: Any) -> Any:
        limit = weight_sync_timeout_s()
        start = time.monotonic()
        while not socket.poll(POLL_MS, event):
            waited = time.monotonic() - start
            if waited > limit:
                raise WeightSyncError(
                    f"verl's weight sync: the vLLM worker at {handle} {what} within {waited:.0f} s (the bound "
                    f"is {limit:.0f} s, set by {WEIGHT_SYNC_TIMEOUT_ENV}); its weight load failed or it died "
                    "(see the vLLM server's log above)")
        return call(*args, **kwargs)

    return wait_then_call


def bound_the_sender_waits(transfer: Any) -> None:
    """`BucketedWeightSender._init_socket`: after verl's own (which binds the REQ socket), the socket's `send` and
    `recv` wait through `_bounded` (`send_pyobj` goes through `send`)."""
    import zmq

    verl_init_socket = transfer.BucketedWeightSender._init_socket

    def init_socket(self: Any) -> None:
        verl_init_socket(self)
        socket, handle = self.socket, self.zmq_handle
        if not isinstance(socket, zmq.Socket):  # what this patch relies on; another verl may differ
            raise WeightSyncError(f"verl's BucketedWeightSender._init_socket left {type(socket).__name__} in "
                                  "`self.socket`, not a ZMQ socket: seal.engines.verl.sync_bound was written for "
                                  "verl 0.9.1")
        socket.send = _bounded(socket, zmq.POLLOUT, socket.send, handle, "did not connect to take weights")
        socket.recv = _bounded(socket, zmq.POLLIN, socket.recv, handle, "acknowledged no weight bucket")

    init_socket._seal_bound = True  # type: ignore[attr-defined]
    transfer.BucketedWeightSender._init_socket = init_socket


def sender_owns_its_segment(transfer: Any) -> None:
    """`BucketedWeightSender._init_buffer`: without CUDA IPC (`use_shm`), verl's version keeps the new /dev/shm
    segment in a local until the receiver has answered, so a handshake that raises (now: the bound) leaks it
    (2 GB by verl's default bucket); owned by the sender from creation on, the sender's `finally` (`_cleanup`)
    unlinks it. With CUDA IPC the bucket is device memory that a raise frees: verl's own method."""
    verl_init_buffer = transfer.BucketedWeightSender._init_buffer

    def init_buffer(self: Any) -> None:
        if not self.use_shm:
            return verl_init_buffer(self)
        import uuid

        import torch

        name = f"verl_weights_{uuid.uuid4().hex}"
        self.shm = transfer.create_shared_memory(self.bucket_size, name)
        self.buffer = torch.frombuffer(self.shm.buf, dtype=torch.uint8)
        self.socket.send_pyobj({"name": name, "size": self.bucket_size})
        self.socket.recv()

    transfer.BucketedWeightSender._init_buffer = init_buffer
