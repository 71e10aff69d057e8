"""Workloads for the sandbox tests: each is a real task run the way the converter's is (`module:function`)."""

from __future__ import annotations

import os
import time

from rag_worker.errors import ApiError


def count(args: dict, emit) -> dict:
    for i in range(args["n"]):
        emit({"step": i})
    return {"counted": args["n"], "pid": os.getpid()}


def big(args: dict, emit) -> dict:
    """A result far larger than one pipe line (an e-mail's headers and hundreds of attachment names)."""
    return {"names": [f"attachment-{i:04d}-{'x' * 40}.txt" for i in range(args["n"])], "pid": os.getpid()}


def refuse(args: dict, emit) -> None:
    raise ApiError("this file is not welcome", code="not_welcome", status=413, field="file")


def hang(args: dict, emit) -> None:
    emit({"pid": os.getpid()})
    while True:
        time.sleep(1)


def hog(args: dict, emit) -> int:
    emit({"pid": os.getpid()})
    blocks = [bytearray(1024 * 1024) for _ in range(args["mb"])]
    return len(blocks)


def abort(args: dict, emit) -> None:
    os.abort()


def crash_after_logging_bad_alloc(args: dict, emit) -> None:
    import logging

    logging.getLogger("some.library").warning("page 3 failed: std::bad_alloc")
    os.abort()
