"""The local-runner environment the runtime tests share: a backend, filesystem checkpoints under
``tmp_path``, parallelism 2, and any further keys; and the counting job's expected results."""

from statekit import StreamExecutionEnvironment


def env_for(tmp_path, backend="hashmap", **conf):
    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": backend, "state.checkpoints.dir": f"{tmp_path}/chk",
        "state.checkpoint-storage": "filesystem", **conf})
    env.set_parallelism(2)
    return env


def expected_final(items):
    """Each key's (count, sum) after ``items``: what the counting jobs end with."""
    out = {}
    for k, v in items:
        c, s = out.get(k, (0, 0))
        out[k] = (c + 1, s + v)
    return out


def final_of(results):
    """Each key's last (count, sum) among a job's emitted ``(key, count, sum)`` rows."""
    out = {}
    for k, c, s in results:
        if c > out.get(k, (0, 0))[0]:
            out[k] = (c, s)
    return out
