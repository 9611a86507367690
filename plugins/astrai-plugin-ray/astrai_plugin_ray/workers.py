"""The run's rollout workers: starting them in their placement group, waiting on their
answers, and naming the worker and node when one dies.

A dead worker is not restarted: it would come back with the initial weights and outside
the weight-push group, so its rollouts would silently come from another policy. Instead
every wait on a worker turns Ray's actor error into :class:`RolloutWorkerDied`, which
names the worker, its process and its node; the run stops (the sampler's ``close``
releases the others) and can be resumed from its last checkpoint.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astrai_core.api import AstraiError, process_registry, sampler_capabilities
from astrai_plugin_ray.cluster import actor_options


class RolloutWorkerDied(AstraiError):
    """A rollout worker's actor died (its process exited, was killed, or its node left)."""


class WorkerSet:
    """``count`` :class:`~astrai_plugin_ray.worker.RolloutWorker` actors in ``group``."""

    def __init__(self, count: int, bundle: dict[str, float], group: Any, model_ref: Any,
                 tokenizer: Any, sampler_name: str, sampler_options: dict[str, Any],
                 device_name: str, timeout_s: float) -> None:
        import ray

        from astrai_plugin_ray.worker import RolloutWorker

        self.timeout_s = timeout_s
        # A sampler that declares `interruptible` gets a `control` group, where interrupt()
        # runs beside a generation; others stay plain actors (every call on the main thread).
        sampler_class = process_registry().load("sampler", sampler_name)
        self.interruptible = sampler_capabilities(sampler_class).interruptible
        self.images = sampler_capabilities(sampler_class).images  # prompts with images
        actor_class = (ray.remote(concurrency_groups={"control": 1})(RolloutWorker)
                       if self.interruptible else ray.remote(RolloutWorker))
        self.actors = [actor_class.options(**actor_options(bundle, group, i)).remote(
            i, model_ref, tokenizer, sampler_name, sampler_options, device_name,
            self.interruptible) for i in range(count)]
        self.dead: set[int] = set()
        self.info: list[dict[str, Any]] = [{"index": i} for i in range(count)]
        self.info = self.get([a.describe.remote() for a in self.actors], "starting",
                             timeout=timeout_s)

    def __len__(self) -> int:
        return len(self.actors)

    # ---------------------------------------------------------------- answers
    def get(self, refs: Sequence[Any], what: str, timeout: float | None = None) -> list[Any]:
        """Each worker's answer (``refs[i]`` from worker ``i``), in order."""
        return [self.get_one(ref, index, what, timeout) for index, ref in enumerate(refs)]

    def get_one(self, ref: Any, index: int, what: str, timeout: float | None = None) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError

        try:
            return ray.get(ref, timeout=timeout)
        except RayActorError as exc:
            self.dead.add(index)
            raise RolloutWorkerDied(self.died_message(index, what, exc)) from None
        except GetTimeoutError:
            raise RolloutWorkerDied(f"{self.name(index)} did not answer {what} within "
                                    f"{timeout:g} s (sampler.timeout_s)") from None

    def first_death(self, refs: Sequence[Any], what: str, cause: BaseException) -> AstraiError:
        """After a collective failed: the error naming the worker that died, when one did."""
        import ray
        from ray.exceptions import RayActorError

        ray.wait(list(refs), num_returns=len(refs), timeout=min(self.timeout_s, 60.0))
        for index, ref in enumerate(refs):
            try:
                ray.get(ref, timeout=0)
            except RayActorError as exc:
                self.dead.add(index)
                return RolloutWorkerDied(self.died_message(index, what, exc))
            except Exception:  # alive, failed because a peer died, or still running
                continue
        return AstraiError(f"{what} to the rollout workers failed: {cause}")

    # ---------------------------------------------------------------- names
    def name(self, index: int) -> str:
        info = self.info[index] if index < len(self.info) else {"index": index}
        where = (f" (pid {info['pid']}, {info['device']}) on node {info['node_ip']} "
                 f"(node id {info['node_id'][:12]})" if "pid" in info else "")
        return f"rollout worker {index} of {len(self.actors)}{where}"

    def died_message(self, index: int, what: str, exc: BaseException) -> str:
        lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
        # Ray's first line says how the actor died; a failed start ends with its exception.
        cause = " ... ".join(dict.fromkeys([lines[0], lines[-1]])) if lines else type(exc).__name__
        return (f"{self.name(index)} died during {what}: {cause}. Rollout workers are not "
                "restarted (one would come back with other weights); the run stops here and "
                "can continue from its last checkpoint with --resume")

    # ---------------------------------------------------------------- end
    def kill(self) -> None:
        import ray

        closing = [a.close.remote() for i, a in enumerate(self.actors) if i not in self.dead]
        ray.wait(closing, num_returns=len(closing), timeout=10)  # let samplers stop engines
        for actor in self.actors:
            ray.kill(actor, no_restart=True)
        self.actors = []
