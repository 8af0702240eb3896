"""One distributed weight update over SGLang servers: SGLang's weight-update session around the
receive, with the trainer's send run beside it.

SGLang's scheduler receives a broadcast only inside a session
(``srt/managers/scheduler_components/weight_updater.py``: ``update_weights_from_distributed``
refuses with "must run between begin_weight_update() and end_weight_update()"), and its session
calls wait on the writer lock behind every in-flight generation unless the server is paused.
``distributed_update`` runs, per server::

    /pause_generation {mode: abort}
    /begin_weight_update                       a refusal: WeightUpdateError, nothing is sent
    /update_weights_from_distributed   <-->    send()   (started once every session is open)
    /end_weight_update                         on every server whose session opened, also on failure
    /continue_generation

An update answered with a failure while ``send`` still runs cancels ``send`` (its cancellation must
abort the broadcast) instead of leaving the trainer to wait for the group timeout; a failed
``send`` cancels the update calls. The HTTP calls are the engine's (``control``: a control call
that raises on failure; ``session``: one that raises ``WeightUpdateError`` with SGLang's message).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from pearl.engines.base import WeightUpdateError
from pearl.engines.child_server import ChildServer

log = logging.getLogger("pearl.engines.sglang")
WEIGHT_SEND_GRACE_S = 60.0  # once every server has received an update, the sender's time to return
SESSION_END_TIMEOUT_S = 60.0  # ``/end_weight_update`` / ``/continue_generation`` after a failed update
SendWeights = Callable[[], Awaitable[Any]]
#: ``(server, path, body)``: one POST to a server
Call = Callable[[Any, str, Mapping[str, Any] | None], Awaitable[Any]]


async def distributed_update(srvs: Sequence[ChildServer], body: dict[str, Any], send: SendWeights | None,
                             control: Call, session: Call) -> Any:
    """Pause, open a session on every server of ``srvs``, receive ``body`` while ``send()`` runs,
    close the sessions and continue (module docstring); returns what ``send`` returned."""
    opened: list[ChildServer] = []
    try:
        await asyncio.gather(*(control(s, "/pause_generation", {"mode": "abort"}) for s in srvs))
        begun = await asyncio.gather(*(session(s, "/begin_weight_update", None) for s in srvs),
                                     return_exceptions=True)
        opened = [s for s, r in zip(srvs, begun, strict=True) if not isinstance(r, BaseException)]
        for r in begun:
            if isinstance(r, BaseException):
                raise r
        sent = await _receive(srvs, body, send, session)
    except BaseException:
        await _end_sessions(opened, srvs, True, control, session)
        raise
    await _end_sessions(opened, srvs, False, control, session)
    return sent


async def _receive(srvs: Sequence[ChildServer], body: dict[str, Any], send: SendWeights | None,
                   session: Call) -> Any:
    """``/update_weights_from_distributed`` on every server while ``send()`` runs. The first
    failure of either side cancels the rest; once every server has received, ``send`` has
    ``WEIGHT_SEND_GRACE_S`` to return."""
    updates = [asyncio.ensure_future(session(s, "/update_weights_from_distributed", body))
               for s in srvs]
    sender = asyncio.ensure_future(send()) if send is not None else None
    waiting: set[asyncio.Future[Any]] = set(updates) | ({sender} if sender is not None else set())
    try:
        while any(not u.done() for u in updates):
            done, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            for d in done:
                d.result()  # a refused update or a failed send raises here
        return await asyncio.wait_for(sender, WEIGHT_SEND_GRACE_S) if sender is not None else None
    except TimeoutError:
        raise WeightUpdateError(srvs[0].spec.worker_id, f"every server received the update but the sender "
                                f"did not return within {WEIGHT_SEND_GRACE_S:.0f} s") from None
    finally:
        rest = [f for f in (*updates, sender) if f is not None and not f.done()]
        for f in rest:
            f.cancel()
        await asyncio.gather(*rest, return_exceptions=True)


async def _end_sessions(opened: Sequence[ChildServer], paused: Sequence[ChildServer], failed: bool,
                        control: Call, session: Call) -> None:
    """``/end_weight_update`` on each server whose session opened, then ``/continue_generation``
    on every live paused one. After a failure each call is bounded by ``SESSION_END_TIMEOUT_S`` (a
    server still receiving answers only when its receive ends) and its own failure is logged;
    after a success a failed end is a ``WeightUpdateError``."""
    async def end(s: ChildServer) -> None:
        if s.alive:
            await session(s, "/end_weight_update", None)
    ends = await asyncio.gather(*(asyncio.wait_for(end(s), SESSION_END_TIMEOUT_S) for s in opened),
                                return_exceptions=True)
    resumed = await asyncio.gather(*(asyncio.wait_for(control(s, "/continue_generation", None),
                                                      SESSION_END_TIMEOUT_S) for s in paused if s.alive),
                                   return_exceptions=True)
    errors = [e for e in (*ends, *resumed) if isinstance(e, BaseException)]
    if errors and not failed:
        raise WeightUpdateError(paused[0].spec.worker_id, f"closing the weight-update session failed: {errors[0]!r}")
    for e in errors:
        log.warning("closing a failed weight-update session: %r", e)
