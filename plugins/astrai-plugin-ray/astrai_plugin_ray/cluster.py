"""Ray's lifecycle for a run: join or start a cluster, place the workers, let go.

* ``address`` (the sampler's option, else ``RAY_ADDRESS``) joins an existing cluster; a
  process where Ray is already initialised (a notebook, a test) keeps its session;
  otherwise a local Ray is started for the run, with the custom resources the device
  backends declare for this machine (``DeviceBackend.ray_resources()``: ``{"NPU": 8}``
  on an Ascend host; GPUs keep Ray's own detection). That Ray listens on 127.0.0.1 alone
  (:func:`loopback_ray`), with no dashboard, unless ``init_kwargs`` name a
  ``_node_ip_address``.
* Only what this run started is stopped by :meth:`RayConnection.close`: the workers'
  placement group always, Ray itself only when the run started it.
* The workers get the trainer's plugin selection (``ASTRAI_PLUGINS``,
  ``ASTRAI_DISABLE_PLUGINS``) through the runtime environment's ``env_vars``, merged into
  a ``runtime_env`` the sampler's ``init_kwargs`` may give (its own variables win).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from typing import Any

from astrai_core.api import LOOPBACK, AstraiError, get_logger, process_registry, scoped_env

log = get_logger("astrai.ray")
PLUGIN_ENV = ("ASTRAI_PLUGINS", "ASTRAI_DISABLE_PLUGINS")  # every worker sees the same plugins
# Ray turns a node address of 127.0.0.1 into the machine's network address unless it
# thinks it runs where clusters are off (Windows, macOS); this variable says so
RAY_CLUSTERS_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"


class RayClusterError(AstraiError):
    """The cluster cannot host the workers (resources, address)."""


def local_ray_resources(registry: Any = None) -> dict[str, float]:
    """Custom resources of this machine's accelerators that Ray does not detect itself:
    the union of every available device backend's ``ray_resources()``."""
    registry = registry or process_registry()
    resources: dict[str, float] = {}
    for spec in registry.specs("device_backend"):
        if not spec.is_available():
            continue
        try:
            backend = spec.load()()
        except Exception as exc:  # a backend that cannot start here declares nothing
            log.warning("device backend skipped for Ray resources", backend=spec.name,
                        error=str(exc))
            continue
        for name, amount in backend.ray_resources().items():
            resources[name] = max(resources.get(name, 0.0), float(amount))
    return resources


def _runtime_env(given: dict[str, Any] | None) -> dict[str, Any] | None:
    """``given`` (a user's runtime_env, or None) with this process's plugin selection added
    to its ``env_vars``, so that every worker loads the plugins the trainer loads."""
    runtime_env = dict(given or {})
    env = {k: os.environ[k] for k in PLUGIN_ENV if k in os.environ}
    if env:
        runtime_env["env_vars"] = {**env, **(runtime_env.get("env_vars") or {})}
    return runtime_env or None


class RayConnection:
    """This run's hold on Ray; see the module docstring."""

    def __init__(self, address: str | None, init_kwargs: dict[str, Any]) -> None:
        import ray

        self.started = False
        if ray.is_initialized():
            self.address = "this process's Ray session"
            return
        address = address or os.environ.get("RAY_ADDRESS") or None
        init_kwargs = dict(init_kwargs)
        kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True,
                                  "runtime_env": _runtime_env(init_kwargs.pop("runtime_env", None))}
        local = address is None and "_node_ip_address" not in init_kwargs
        if address is None:
            resources = local_ray_resources()
            if resources:
                kwargs["resources"] = resources
            log.info("starting a local Ray", resources=resources or None,
                     listens_on=LOOPBACK if local else init_kwargs["_node_ip_address"])
        else:
            kwargs = {"address": address, "log_to_driver": True,
                      "runtime_env": kwargs["runtime_env"]}
        kwargs.update(init_kwargs)
        try:
            with loopback_ray() if local else contextlib.nullcontext():
                ray.init(**{k: v for k, v in kwargs.items() if v is not None})
        except ConnectionError as exc:
            raise RayClusterError(f"cannot join the Ray cluster at {address!r}: {exc}") from None
        self.started = True
        self.address = address or "a local Ray"

    @property
    def is_client(self) -> bool:
        """A Ray Client connection (``ray://``): this process is outside the cluster."""
        return self.address.startswith("ray://")

    def close(self) -> None:
        import ray

        if self.started and ray.is_initialized():
            ray.shutdown()
        self.started = False


@contextlib.contextmanager
def loopback_ray() -> Iterator[None]:
    """While a local Ray starts: its node address is 127.0.0.1, so that its services (GCS,
    raylet, object manager, the agents, every worker's gRPC server) listen on loopback
    alone. The processes it starts inherit the variable, so Ray's workers and agents
    started later keep to that address too."""
    from ray._private import ray_constants

    enabled = ray_constants.ENABLE_RAY_CLUSTER  # read by this process's Ray when it starts
    ray_constants.ENABLE_RAY_CLUSTER = False
    try:
        with scoped_env({RAY_CLUSTERS_ENV: "0"}):
            yield
    finally:
        ray_constants.ENABLE_RAY_CLUSTER = enabled


def place_workers(bundle: dict[str, float], count: int, strategy: str, timeout_s: float) -> Any:
    """A placement group of ``count`` bundles of ``bundle``, ready; a clear error when the
    cluster lacks the resources or they do not free up within ``timeout_s``."""
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    total = ray.cluster_resources()
    short = {name: amount * count for name, amount in bundle.items()
             if total.get(name, 0.0) < amount * count}
    if short:
        needed = ", ".join(f"{name}: {amount:g} (cluster has {total.get(name, 0.0):g})"
                           for name, amount in short.items())
        raise RayClusterError(
            f"sampler.worker_resources: {count} worker(s) x {bundle} need {needed}. Give the "
            "nodes these resources (an existing cluster: `ray start --resources="
            "'{\"NPU\": 8}'` on each node; see docs/disaggregated-rollouts.md) or use fewer "
            "workers")
    group = placement_group([dict(bundle) for _ in range(count)], strategy=strategy)
    if not group.wait(timeout_seconds=timeout_s):
        remove_placement_group(group)
        raise RayClusterError(f"the placement group of {count} x {bundle} ({strategy}) was "
                              f"not ready after {timeout_s:g} s: the resources are in use, "
                              "or the strategy cannot be met by the cluster's nodes")
    return group


def actor_options(bundle: dict[str, float], group: Any, index: int) -> dict[str, Any]:
    """``.options()`` of worker ``index``: its bundle's resources, in its bundle."""
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    resources = {k: v for k, v in bundle.items() if k not in ("CPU", "GPU")}
    return {"num_cpus": bundle.get("CPU", 0.0), "num_gpus": bundle.get("GPU", 0.0),
            "resources": resources or None, "max_restarts": 0, "max_task_retries": 0,
            "scheduling_strategy": PlacementGroupSchedulingStrategy(
                placement_group=group, placement_group_bundle_index=index)}
