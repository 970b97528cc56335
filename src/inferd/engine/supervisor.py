"""`inferd serve --workers N --engine`: N front ends and one engine, and their supervisor.

The supervisor of `--workers N` (workers/supervisor.py) with other children: N front ends
(engine/front_end.py) sharing the HTTP and gRPC ports, and one engine (engine_role.run_engine)
that owns the repository, the batchers and the instances and serves /metrics itself. A
child that dies is restarted the same way (the engine reloads the repository; meanwhile
the front ends answer 503 and readiness is false). SIGTERM stops the front ends first (each
drains its open requests, which the engine still serves), then the engine.
"""

from __future__ import annotations

import dataclasses
import gc
import multiprocessing
import os
import signal

from inferd import log as inferd_log
from inferd.limits import ensure_file_descriptors
from inferd.settings import Settings
from inferd.workers.peers import WorkerSlot
from inferd.workers.supervisor import Supervisor, WorkersError, _die_with_parent


def check(settings: Settings) -> None:
    if settings.http_port == 0 or settings.grpc_port == 0:
        raise WorkersError("--workers > 1 needs fixed ports (0, any free port, differs per worker)")


def _is_engine(slot: WorkerSlot) -> bool:
    return slot.index == slot.count  # after the front ends' 0..N-1


def _child_main(settings: Settings, slot: WorkerSlot, supervisor_pid: int) -> None:
    """A child's entry point (forked by the supervisor, started with SIGINT ignored)."""
    # The fork copied the supervisor's SIGTERM handler, which only flags the supervisor's
    # own loop: until uvicorn installs its handlers, SIGTERM must end the child.
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _die_with_parent()
    try:
        os.kill(supervisor_pid, 0)
    except ProcessLookupError:
        return  # the supervisor died before the parent-death signal was armed
    os.setpgid(0, 0)  # as a worker: a terminal's Ctrl-C reaches the supervisor only
    if _is_engine(slot):
        from inferd.engine.engine_role import run_engine

        inferd_log.configure(settings.log_level, settings.log_format, worker="engine")
        run_engine(settings, slot.directory)
    else:
        from inferd.engine.front_end import run_front_end

        inferd_log.configure(settings.log_level, settings.log_format, worker=slot.index)
        # The engine serves /metrics; front ends serve no port of their own beyond the shared.
        run_front_end(dataclasses.replace(settings, metrics_port=None), slot.directory, slot.index)


class EngineSupervisor(Supervisor):
    def __init__(self, settings: Settings) -> None:
        # The engine's metrics are the server's: it serves the port, not the supervisor.
        super().__init__(dataclasses.replace(settings, metrics_port=None))
        self.engine_settings = settings
        # Children forked from the supervisor itself, which has imported what they run: the
        # interpreter's heap of that code (module dicts, functions, classes) is shared copy on
        # write, so N front ends cost far less than N fresh interpreters or a fork server's
        # children (docs/benchmarks.md, "Memory: weights once"). Forking is safe here: in this
        # mode the supervisor serves no metrics, so it has no thread; nothing imported starts
        # one or touches an accelerator (the engine loads models after its fork).
        import inferd.engine.engine_role  # noqa: F401
        import inferd.engine.front_end  # noqa: F401

        self.context = multiprocessing.get_context("fork")

    def _start(self, slot: WorkerSlot) -> multiprocessing.process.BaseProcess:
        # Frozen objects are left alone by the children's collector, which would otherwise
        # write to (and so copy) every page holding one when it walks them.
        gc.collect()
        gc.freeze()
        return super()._start(slot)

    def _slots(self) -> list[WorkerSlot]:
        n = self.settings.workers
        return [WorkerSlot(i, n, self.directory) for i in range(n + 1)]  # index n: the engine

    def _process(self, slot: WorkerSlot) -> multiprocessing.process.BaseProcess:
        engine = _is_engine(slot)
        return self.context.Process(
            target=_child_main,
            args=(self.engine_settings, slot, os.getpid()),
            name="inferd-engine" if engine else f"inferd-front-end-{slot.index}",
        )

    def _stop_all(self) -> int:
        """Front ends first (their open requests finish in the engine), then the engine."""
        front_ends = [w for w in self.workers if not _is_engine(w.slot)]
        engine = [w for w in self.workers if _is_engine(w.slot)]
        return max(self._stop(front_ends), self._stop(engine))


def run(settings: Settings) -> None:
    ensure_file_descriptors(settings.limits)
    check(settings)
    code = EngineSupervisor(settings).run()
    if code:
        raise SystemExit(code)
