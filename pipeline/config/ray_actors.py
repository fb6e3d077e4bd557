"""The `ray` section: the actor pool that holds the engines, and what each actor asks Ray for."""

from __future__ import annotations

from dataclasses import dataclass

from pipeline.config.typed import require as _require


@dataclass(frozen=True)
class RayConfig:
    # The actor pool: each actor holds the model and a decoder; Ray Data autoscales between these.
    min_actors: int = 1
    max_actors: int = 1
    # Fractional on purpose: Ray's CPU count is a reservation (the actor's threads are
    # model.num_threads), and on a 2-CPU machine a pool that takes every CPU starves Ray Data's read
    # and write tasks and the job hangs forever. A resumed run adds Ray Data's checkpoint-filter
    # actor, which takes a whole CPU; with reads and writes at 0.25 each, 0.5 still fits 2 CPUs.
    num_cpus_per_actor: float = 0.5
    num_gpus_per_actor: float = 0.0
    # Rows per map_batches call: the blocks Ray moves to an actor and writes back. 0 (auto): the
    # vLLM engine's slots (it runs several batches at once, max_concurrent_batches, so they never wait
    # for one to drain; a batch costs Ray's scheduling whatever its rows), 8 with the transformers
    # engine; a job's long run takes a multiple of it, 200 batches an actor at most (run_batch_size).
    batch_size: int = 0
    # Batches an actor works on at once. 0 (auto): one with the transformers engine; with vLLM
    # enough to hold 3x the engine's slots, plus one (concurrent_batches below).
    max_concurrent_batches: int = 0
    # Actors (and the task that prepares the model) run only on nodes with this accelerator, in
    # Ray's names (A100, H100, L4, ...; ray.util.accelerators); "": any node with the resources.
    accelerator_type: str = ""
    # A job whose actors cannot be placed within this many seconds fails, naming the resources it
    # asked for (an autoscaler has this long to bring a node up).
    wait_for_actors_s: float = 600.0

    def __post_init__(self):
        _require(self.min_actors >= 1, "ray.min_actors", "an integer >= 1")
        _require(
            self.max_actors >= self.min_actors, "ray.max_actors", f"an integer >= ray.min_actors ({self.min_actors})"
        )
        _require(self.num_cpus_per_actor > 0, "ray.num_cpus_per_actor", "a number > 0")
        _require(self.num_gpus_per_actor >= 0, "ray.num_gpus_per_actor", "a number >= 0")
        _require(self.batch_size >= 0, "ray.batch_size", "an integer >= 0 (0: auto)")
        _require(self.max_concurrent_batches >= 0, "ray.max_concurrent_batches", "an integer >= 0 (0: auto)")
        _require(self.wait_for_actors_s > 0, "ray.wait_for_actors_s", "a number of seconds > 0")
        if self.accelerator_type:
            from ray.util import accelerators

            known = sorted(
                value for name, value in vars(accelerators).items() if name.isupper() and isinstance(value, str)
            )
            _require(
                self.accelerator_type in known,
                "ray.accelerator_type",
                f"one of Ray's accelerator names ({', '.join(known)})",
            )
