"""RefitHandle: the persistent refit of one spec between this rank's buffers and its peers'."""
from . import _reshard
from ._buffers import buffer_args
from .errors import _BY_CODE, Error, InvalidArgumentError

_SCHEDULES = {"domain_aware": _reshard.Schedule.domain_aware,
              "point_to_point": _reshard.Schedule.point_to_point}
_FANOUTS = {"auto": _reshard.Fanout.auto, "engine": _reshard.Fanout.engine}


def _enum(value, table, what):
    if isinstance(value, str):
        if value not in table:
            raise InvalidArgumentError("%s must be one of %s, not %r"
                                       % (what, ", ".join(table), value))
        return table[value]
    return value


def _stream_value(stream):
    """A CUDA stream as its cudaStream_t value: a torch.cuda.Stream (anything with an integer
    `cuda_stream`, e.g. torch.cuda.current_stream()), or that value as an int (0: CUDA's legacy
    default stream, which is torch's default stream)."""
    value = getattr(stream, "cuda_stream", stream)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise InvalidArgumentError(
            "stream must be a torch.cuda.Stream (or have an integer cuda_stream) or a "
            "cudaStream_t as a non-negative int, not %r" % (stream,))
    return value


def _abandon(comm, spec, options, error):
    code = next((n for n, cls in _BY_CODE.items() if type(error) is cls), None)
    if code is None:  # a Python error (TypeError from a bad object, ...): INVALID_ARGUMENT
        code = 3 if not isinstance(error, Error) else 2
    _reshard._Handle.abandon(comm, spec, code, str(error), options)


class RefitHandle:
    """Refits `spec` between this rank's buffers and its peers', once per training step.

    Creating one is collective over every rank the spec names (each plans its share, registers
    its buffers and exchanges keys once); refits after the first only move data. `sources` and
    `destinations` map this rank's buffer names (the spec's buffer names, or tensor names for
    tensors without a buffer) to torch tensors (host or CUDA; DTensors give their local shard),
    DLPack or buffer-protocol arrays, or (address, bytes[, 'host'|'cuda']) tuples; the handle
    keeps them alive. ``spec.local_buffers(rank)`` lists what this rank must give, with sizes.

    ``delta=True``: delta refits (docs/delta.md): sources send only the elements that changed
    since the last refit whenever the receiver holds that version; destinations must keep the
    last refit's values between refits (host or CUDA buffers: CUDA sources are encoded and
    CUDA destinations applied on the GPU where the build has the kernels).

    ``stage_ring_bytes``: the staging ring's budget for CUDA sources that UCX cannot register
    (docs/data-plane.md, "The staging ring"; None: the library's default, 256 MiB). The library
    refuses a budget below its minimum at set-up (InvalidArgumentError naming the rank).

    ``stage_landing_bytes``: the landing rounds' budget for CUDA destinations that UCX cannot
    register (docs/data-plane.md, "Destinations"; None: the library's default, 256 MiB).

    ``stage_round_bytes``: the largest landing round: each sender's stream is copied to the
    device round by round while its next rounds land (None: the library's default, 8 MiB; at
    least 4096).

    Every rank calls execute() (or start() + wait()) the same number of times. Blocking calls
    release the GIL. Errors are reshard.errors' classes with the library's message.
    """

    def __init__(self, comm, spec, sources=None, destinations=None, *, name="",
                 schedule="domain_aware", fanout="auto", setup_timeout=60.0,
                 allow_larger_buffers=False, delta=False, stage_ring_bytes=None,
                 stage_landing_bytes=None, stage_round_bytes=None):
        options = _reshard.HandleOptions()
        options.name = str(name)
        try:
            options.schedule = _enum(schedule, _SCHEDULES, "schedule")
            options.fanout = _enum(fanout, _FANOUTS, "fanout")
            options.setup_timeout = float(setup_timeout)
            options.allow_larger_buffers = bool(allow_larger_buffers)
            options.delta = bool(delta)
            if stage_ring_bytes is not None:  # An int: anything else is a TypeError here.
                options.stage_ring_bytes = stage_ring_bytes
            if stage_landing_bytes is not None:
                options.stage_landing_bytes = stage_landing_bytes
            if stage_round_bytes is not None:
                options.stage_round_bytes = stage_round_bytes
            args = buffer_args(spec, comm.rank, sources, destinations)
        except Exception as e:
            # Refused before the collective set-up: the other ranks would wait for this rank
            # until their setup_timeout. Abandon takes this rank's part and fails them at once
            # with this message (reshard::RefitHandle::Abandon).
            _abandon(comm, spec, options, e)
            raise
        self._handle = _reshard._Handle.create(comm, spec, args, options)

    def execute(self, timeout=60.0, *, stream=None):
        """One refit, every rank: returns when this rank's part is done (sources: data remotely
        complete; destinations: every byte landed). `stream`: a CUDA stream whose queued work
        (the optimizer step that wrote the weights, the forward pass still reading the
        destinations) the refit must follow, without synchronising it or the device: see
        start(). It is start(stream=stream) then wait(timeout, stream=stream): work other threads
        queue on the stream meanwhile runs after the refit too."""
        if stream is None:
            self._handle.execute(float(timeout))
            return
        value = _stream_value(stream)
        self._handle.start_on_stream(value)
        self._handle.record_completion(value)
        self._handle.wait(float(timeout))

    def start(self, *, stream=None):
        """Begins the next refit without blocking; call wait() soon (progress happens there).
        `stream` (a torch.cuda.Stream or a cudaStream_t int, 0 the default stream): nothing
        reads this rank's sources or writes its destinations before the work queued on it
        before this call is done; wait() starts the refit then, its timeout covering that work
        (RefitHandle::StartOnStream)."""
        if stream is None:
            self._handle.start()
        else:
            self._handle.start_on_stream(_stream_value(stream))

    def record_completion(self, stream):
        """Between start() and the end of wait(): work queued on `stream` (a torch.cuda.Stream
        or a cudaStream_t int) after this call, such as the next forward pass, runs on the
        device once this rank's part of the refit is done, without the host waiting for the
        stream. A refit that fails, is reset or closed releases the stream too; its error is
        what wait() raises, and the destinations must not be used then
        (RefitHandle::RecordCompletion)."""
        self._handle.record_completion(_stream_value(stream))

    def wait(self, timeout=60.0, *, stream=None):
        """Completes the refit begun by start(). Destinations hold the new weights on return.
        `stream`: record_completion(stream) first, so work queued on it meanwhile by other
        threads runs after the refit too."""
        if stream is not None:
            self._handle.record_completion(_stream_value(stream))
        self._handle.wait(float(timeout))

    def reset(self):
        """Forgets a failed refit so the handle may refit again (every rank must reset)."""
        self._handle.reset()

    def barrier(self, timeout=60.0):
        """Blocks until every rank of the spec called barrier() as often as this one."""
        self._handle.barrier(float(timeout))

    def close(self):
        """Destroys the handle (abandoning a refit in flight) and releases the buffers."""
        self._handle.close()

    @property
    def closed(self):
        return self._handle.closed

    @property
    def stats(self):
        """reshard.Stats of the last refit on this rank (bytes by path, pieces, times ...)."""
        return self._handle.stats

    @property
    def failed(self):
        return self._handle.failed

    @property
    def epoch(self):
        return self._handle.epoch

    @property
    def rank(self):
        return self._handle.rank

    @property
    def plan_fingerprint(self):
        return self._handle.plan_fingerprint

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
        return False

    def __repr__(self):
        if not hasattr(self, "_handle"):  # __init__ failed
            return "RefitHandle(not created)"
        if self.closed:
            return "RefitHandle(closed)"
        return "RefitHandle(rank=%d, epoch=%d, failed=%s)" % (self.rank, self.epoch, self.failed)
