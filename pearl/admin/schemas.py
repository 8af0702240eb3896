"""Wire shapes of the admin API: pydantic models of every request body and response.

These models are the single source of truth for validation (a bad field -> 422 naming it) and for
the OpenAPI document (``pearl.admin.openapi`` renders their JSON Schemas). Request models forbid
unknown keys (a typo must not be silently ignored); the AWS shapes allow them (AWS adds fields).

Identifiers (GPU, node, instance, notice, event ids) are 1-128 characters from ``[A-Za-z0-9._:@+-]``
with dots only between other characters: wide enough for ``i-0abc...`` instance ids and versioned
names, narrow enough that nothing a client sends can inject into a log line or name a path (no
separator, no ``..``, no leading dot: worker ids and server folders are built from these ids). Floats reject NaN and infinity. Numbers are JSON numbers: ``true`` is
not a number and ``"3"`` not a step (``Int`` / ``Num``).
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, StringConstraints, field_validator, model_validator
from pydantic.json_schema import WithJsonSchema

from pearl.core.ids import IDENT_MAX as IDENT_MAX  # the one rule for ids (pearl.core.ids)
from pearl.core.ids import IDENT_PATTERN as IDENT_PATTERN

Ident = Annotated[str, StringConstraints(min_length=1, max_length=IDENT_MAX, pattern=IDENT_PATTERN)]

#: A reclaim deadline further away than this is rejected (clouds give minutes, not days).
MAX_DEADLINE_S = 86_400.0


def _a_number(v: Any) -> Any:
    """JSON numbers only: ``true`` / ``false`` and numeric strings are refused (pydantic's lax mode
    would read them as 1 / 0 / 3). An integral float such as ``3.0`` is the integer 3, as in JSON Schema."""
    if isinstance(v, bool | str | bytes):
        raise ValueError(f"must be a JSON number, not {type(v).__name__}")
    return v


Int = Annotated[int, BeforeValidator(_a_number)]
Num = Annotated[float, BeforeValidator(_a_number)]


def _no_default(schema: dict[str, Any]) -> None:
    schema.pop("default", None)


class _In(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class _Out(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# ------------------------------------------------------------------------------ signals in
class GrantedGpuIn(_In):
    gpu_id: Ident = Field(description="GPU id, unique in the cluster")
    node: Ident = Field(default="node0", description="node (host) the GPU is on")
    instance_id: Ident | None = Field(default=None, description="cloud instance the GPU came with")


class GpusGrantedIn(_In):
    """Preemptible GPUs became available."""

    gpus: list[GrantedGpuIn] = Field(min_length=1, max_length=1024)
    event_id: Ident | None = Field(default=None, description="idempotency key (or header Idempotency-Key)")

    @field_validator("gpus")
    @classmethod
    def _unique(cls, gpus: list[GrantedGpuIn]) -> list[GrantedGpuIn]:
        seen: set[str] = set()
        for g in gpus:
            if g.gpu_id in seen:
                raise ValueError(f"gpu_id {g.gpu_id!r} listed twice")
            seen.add(g.gpu_id)
        return gpus


class ReclaimNoticeIn(_In):
    """Preemptible GPUs will be taken: name them by ``gpu_ids`` or by the cloud ``instance_id`` they
    were registered with, and give the deadline relative (``deadline_in_s``) or absolute (``deadline``,
    RFC 3339). The two choices are ``oneOf`` in the JSON Schema; an explicit ``null`` is refused."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {"oneOf": [{"required": ["gpu_ids"]}, {"required": ["instance_id"]}]},
                {"oneOf": [{"required": ["deadline_in_s"]}, {"required": ["deadline"]}]},
            ]
        }
    )

    # plain ``X | None`` for validation; the JSON Schema leaves the null out (null is refused below)
    # and has no ``default`` (a default of null would not match the field's own schema)
    gpu_ids: Annotated[
        list[Ident] | None,
        WithJsonSchema({"type": "array", "items": {"type": "string", "pattern": IDENT_PATTERN, "minLength": 1,
                                                    "maxLength": IDENT_MAX},
                        "minItems": 1, "maxItems": 1024}),
    ] = Field(default=None, min_length=1, max_length=1024, json_schema_extra=_no_default)
    instance_id: Annotated[Ident | None, WithJsonSchema({"type": "string", "pattern": IDENT_PATTERN,
                                                         "minLength": 1, "maxLength": IDENT_MAX})] = Field(
        default=None, json_schema_extra=_no_default)
    deadline_in_s: Annotated[
        Num | None, WithJsonSchema({"type": "number", "minimum": 0, "maximum": MAX_DEADLINE_S})
    ] = Field(default=None, ge=0, le=MAX_DEADLINE_S, allow_inf_nan=False, json_schema_extra=_no_default)
    deadline: Annotated[
        datetime | None,
        WithJsonSchema({"type": "string", "format": "date-time",
                        "description": "absolute deadline, RFC 3339 with a time zone, at most "
                                       f"{MAX_DEADLINE_S:.0f} s from now"}),
    ] = Field(default=None, json_schema_extra=_no_default)
    notice_id: Ident | None = Field(default=None, description="id to cancel the notice by (default: the event id)")
    event_id: Ident | None = None

    @field_validator("gpu_ids", "instance_id", "deadline_in_s", "deadline", mode="before")
    @classmethod
    def _not_null(cls, v: Any) -> Any:
        if v is None:
            raise ValueError("leave the field out instead of sending null")
        return v

    @field_validator("deadline")
    @classmethod
    def _zoned(cls, t: datetime | None) -> datetime | None:
        if t is not None and t.tzinfo is None:
            raise ValueError("deadline needs a time zone (e.g. 2026-11-29T14:00:00Z)")
        return t

    @field_validator("gpu_ids")
    @classmethod
    def _unique(cls, ids: list[str] | None) -> list[str] | None:
        if ids is not None and len(set(ids)) != len(ids):
            raise ValueError("lists a GPU twice")
        return ids

    @model_validator(mode="after")
    def _one_of(self) -> ReclaimNoticeIn:
        if (self.gpu_ids is None) == (self.instance_id is None):
            raise ValueError("give exactly one of gpu_ids and instance_id")
        if (self.deadline_in_s is None) == (self.deadline is None):
            raise ValueError("give exactly one of deadline_in_s and deadline")
        return self


class NoticeCancelledIn(_In):
    notice_id: Ident
    event_id: Ident | None = None


class TrainingStartedIn(_In):
    step: Int = Field(ge=0, le=2**31)
    event_id: Ident | None = None


class TrainingFinishedIn(_In):
    step: Int = Field(ge=0, le=2**31)
    weight_version: Int = Field(ge=0, le=2**31)
    # the JSON Schema written out: pydantic renders the bounds of ``Num | None`` as "ge" / "le",
    # which are no JSON Schema keywords (a client generated from the document would not see them)
    expected_idle_s: Annotated[
        Num | None,
        WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0, "maximum": MAX_DEADLINE_S}, {"type": "null"}]}),
    ] = Field(default=None, ge=0, le=MAX_DEADLINE_S, allow_inf_nan=False)
    event_id: Ident | None = None


# ------------------------------------------------------------------------------ cloud shapes
AWS_SPOT_WARNING = "EC2 Spot Instance Interruption Warning"


class AwsSpotDetail(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)
    instance_id: Ident = Field(alias="instance-id")
    instance_action: Literal["terminate", "stop", "hibernate"] = Field(alias="instance-action")


class AwsSpotInterruptionIn(BaseModel):
    """The AWS EventBridge event (``source: aws.ec2``). The instance is taken 2 minutes after ``time``."""

    model_config = ConfigDict(extra="allow", frozen=True, populate_by_name=True)
    id: Ident = Field(description="EventBridge event id (the idempotency key)")
    detail_type: Literal["EC2 Spot Instance Interruption Warning"] = Field(alias="detail-type")
    source: Literal["aws.ec2"] = "aws.ec2"
    time: datetime
    detail: AwsSpotDetail


class InstanceActionIn(BaseModel):
    """The EC2 instance metadata document ``/latest/meta-data/spot/instance-action``."""

    model_config = ConfigDict(extra="allow", frozen=True)
    action: Literal["terminate", "stop", "hibernate"]
    time: datetime = Field(description="when the instance will be taken (the deadline)")


# ------------------------------------------------------------------------------ responses
class FieldError(_Out):
    field: str
    reason: str


class ErrorOut(_Out):
    error: str = Field(description="machine-readable code, e.g. validation, not_found, unauthorized")
    message: str
    fields: list[FieldError] = Field(default_factory=list)


class EventAcceptedOut(_Out):
    applied: bool
    duplicate: bool
    event_id: str
    kind: str
    gpu_ids: list[str] = Field(default_factory=list, description="GPUs the event names (after instance mapping)")
    detail: str = ""


class GpuOut(_Out):
    gpu_id: str
    zone: Literal["reserved", "preemptible", "overlap"]
    node: str
    instance_id: str | None
    lent: bool


class WorkerOut(_Out):
    worker_id: str
    gpus: list[str]
    role: Literal["colocated", "prefill", "decode"]
    status: Literal["initializing", "active", "draining", "inactive"]


class StateOut(_Out):
    version: int
    gpus: list[GpuOut]
    workers: list[WorkerOut]


class DecisionOut(_Out):
    decision: dict[str, Any] | None = Field(description="None before the first decision")


class HistoryOut(_Out):
    entries: list[dict[str, Any]]


class ProgressOut(_Out):
    rollout_step: int
    train_step: int
    weight_version: int
    trajectories_completed: int
    trajectories_in_flight: int
    trajectories_interrupted: int
    trajectories_lost: int
    tokens_generated: int
    throughput_traj_per_h: float | None = Field(description="None while undefined")
    uptime_s: float | None
    extra: dict[str, Any]


class NodeOut(BaseModel):
    model_config = ConfigDict(extra="allow", frozen=True)
    node: str
    rank: int | None = None
    healthy: bool
    workers: dict[str, bool] = Field(default_factory=dict, description="worker id -> engine server healthy")
    error: str | None = None


class NodesOut(_Out):
    nodes: list[NodeOut]


class HealthOut(_Out):
    status: Literal["ok", "degraded"] = Field(description="degraded: the service runs but cannot journal")
    journal: str | None = Field(default=None, description="why the journal cannot write (disk full, I/O error)")
