"""The local-runner environment the runtime tests share: a backend, filesystem checkpoints under
``tmp_path``, parallelism 2, and any further keys."""

from statekit import StreamExecutionEnvironment


def env_for(tmp_path, backend="hashmap", **conf):
    env = StreamExecutionEnvironment.get_execution_environment({
        "state.backend.type": backend, "state.checkpoints.dir": f"{tmp_path}/chk",
        "state.checkpoint-storage": "filesystem", **conf})
    env.set_parallelism(2)
    return env
