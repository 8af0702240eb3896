"""The run config's sections for the service and the environment: ``AdminSpec`` (the admin API and
the node agents), ``CloudWatchSpec`` (cloud preemption notices), ``PricesSpec`` ($/GPU-hour per
zone), ``EnvSpec`` (which environment rolls out), and ``StrictSection``, the base of every section
(unknown keys rejected, frozen). ``pearl.config`` re-exports them; load configs through it.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator


class StrictSection(BaseModel):
    """A config section: unknown keys are an error (a typo must not fall back to a default); frozen."""

    model_config = ConfigDict(extra="forbid", frozen=True)


# ------------------------------------------------------------------------------------- admin
class AdminSpec(StrictSection):
    """The admin API on the controller (docs/service.md). Without a token it only listens on loopback."""

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    token: str | None = Field(default=None, repr=False, description="bearer token; or env PEARL_ADMIN_TOKEN")
    max_body_bytes: int = Field(default=64 * 1024, ge=1024)
    max_events_per_s: float = Field(default=50.0, gt=0, description="POST rate limit per client (burst: 1 s)")
    max_reads_per_s: float = Field(default=2000.0, gt=0, description="GET rate limit per client (burst: 1 s)")
    submit_timeout_s: float = Field(default=10.0, gt=0, description="wait for the controller to take an event")
    read_timeout_s: float = Field(default=30.0, gt=0, description="a request line + headers, or a body, not "
                                  "received within this many seconds: the connection is closed (408 for a body)")
    agent_port: int = Field(default=0, ge=0, le=65535, description="node agent HTTP port (0: any free port)")
    # Rank 0's agent watcher (pearl/runtime/node/watch.py)
    agent_health_period_s: float = Field(default=5.0, gt=0, description="seconds between two health polls of each agent")
    agent_health_timeout_s: float = Field(default=5.0, gt=0, description="a health poll not answered in time is a miss")
    agent_health_misses: int = Field(default=3, ge=1, description="consecutive misses after which a node is lost")
    log_json: bool = Field(default=False, description="structured logs as one JSON object per line")
    tensorboard: bool = Field(default=True, description="write TensorBoard scalars under output_dir")


class CloudWatchSpec(StrictSection):
    """Preemption signals read from the cloud on each node (``pearl.runtime.node.cloud_watch``); opt-in."""

    aws: bool = Field(default=False, description="poll EC2 instance metadata (IMDSv2) for spot / rebalance notices")
    gcp: bool = Field(default=False, description="wait on the GCE metadata server's preempted / maintenance-event")
    kubernetes: bool = Field(default=False, description="poll this node's Node object (deletion, drain taints)")
    aws_url: str = "http://169.254.169.254"
    gcp_url: str = "http://metadata.google.internal"
    kubernetes_url: str = "https://kubernetes.default.svc"
    kubernetes_node: str | None = Field(default=None, description="the Kubernetes node name (default: env NODE_NAME)")
    period_s: float = Field(default=2.0, gt=0, description="seconds between two polls of a source")
    timeout_s: float = Field(default=2.0, gt=0, description="per request (GCP's hanging GETs: 60 s more)")
    max_backoff_s: float = Field(default=60.0, gt=0, description="the back-off after errors doubles up to this")
    rebalance_deadline_s: float | None = Field(default=None, ge=0, description="an AWS rebalance recommendation "
                                               "becomes a notice due this long after it (None: logged only)")
    gcp_notice_s: float = Field(default=30.0, gt=0, description="GCE's preemption notice")
    kubernetes_grace_s: float = Field(default=30.0, gt=0, description="a node being deleted or drained: deadline")

    @model_validator(mode="after")
    def _check(self) -> CloudWatchSpec:
        if self.max_backoff_s < self.period_s:
            raise ValueError(f"max_backoff_s={self.max_backoff_s} is below period_s={self.period_s}")
        return self

    @property
    def enabled(self) -> bool:
        return self.aws or self.gcp or self.kubernetes


class PricesSpec(StrictSection):
    """$/GPU-hour by zone. Default: H100 prices RLBoost used ($83.79/h on-demand, $21.28/h spot per 8 GPUs)."""

    reserved: float = Field(default=83.79 / 8, ge=0)
    overlap: float = Field(default=83.79 / 8, ge=0)
    preemptible: float = Field(default=21.28 / 8, ge=0)


# --------------------------------------------------------------------------------------- env
class EnvSpec(StrictSection):
    """The agent environment of a real run (``envs/``, docs/envs.md).

    The trajectory token limit is ``workload.max_trajectory_tokens``; the episode ends (and, with
    ``on_limit: submit``, is graded as it stands) when it, ``max_turns`` or a per-turn budget runs out.
    """

    kind: Literal["repofix", "swebench", "tiny"] = Field(default="repofix", description="which environment")
    num_tasks: int = Field(default=16, ge=1, description="repofix / tiny: tasks generated (cycled over groups)")
    seed: int = Field(default=0, description="task generation seed (repofix mutations, tiny words)")
    projects: list[str] = Field(default_factory=list, description="repofix projects to use (empty: all)")
    tiny_turns: int = Field(default=1, ge=1, description="tiny: words asked per episode")
    dataset: str | None = Field(default=None, description="swebench: instances file (.json/.jsonl/.parquet)")
    instance_ids: list[str] = Field(default_factory=list, description="swebench: subset of instances (empty: all)")
    image_prefix: str = Field(default="sweb.eval.x86_64.", description="swebench: instance image name prefix")
    image_namespace: str | None = Field(
        default=None, description="swebench: registry namespace (e.g. 'swebench' on Docker Hub: __ -> _1776_)")
    image_tag: str = "latest"
    docker_binary: str = Field(default="docker", description="swebench: the Docker CLI")
    docker_memory: str = Field(default="8g", description="swebench: container memory cap (docker --memory)")
    include_hints: bool = Field(default=False, description="swebench: show hints_text in the prompt")
    max_turns: int = Field(default=30, ge=1, description="tool calls per episode")
    max_new_tokens: int = Field(default=1024, ge=1, description="generation budget of one turn")
    max_observation_tokens: int = Field(default=2048, ge=16, description="longer observations are clipped")
    min_turn_tokens: int = Field(default=16, ge=1, description="a turn with less budget left is not started")
    on_limit: Literal["submit", "zero"] = Field(
        default="submit", description="at a turn/token limit: grade the work as it stands, or reward 0")
    command_timeout_s: float = Field(default=30.0, gt=0, description="one tool command / test run (wall clock)")
    eval_timeout_s: float = Field(default=1800.0, gt=0, description="final grading run (swebench harness: 1800)")
    memory_mb: int = Field(default=1024, ge=64, description="repofix: address-space limit of a command")
    max_output_chars: int = Field(default=16000, ge=256, description="captured command output per call")
    allow_shell: bool = Field(default=False, description="repofix: offer the (unconfined) shell tool")
    enable_thinking: bool | None = Field(
        default=None, description="passed to the chat template (Qwen3); None: the template's default")
    workdir: str | None = Field(default=None, description="repofix: parent folder of episode checkouts")

    @model_validator(mode="after")
    def _check(self) -> EnvSpec:
        if self.kind == "swebench" and not self.dataset:
            raise ValueError("env.kind=swebench needs env.dataset (a SWE-bench .json/.jsonl/.parquet file)")
        if self.min_turn_tokens > self.max_new_tokens:
            raise ValueError(f"env.min_turn_tokens={self.min_turn_tokens} > env.max_new_tokens={self.max_new_tokens}")
        return self


