"""Physical disk profiles (nvme / sata-ssd / hdd-7200) for statekit benchmarks."""

from .profiles import (  # noqa: F401
    HDD_7200,
    NVME,
    PROFILE_NAMES,
    PROFILES,
    SATA_SSD,
    Profile,
    build_shim,
    get_profile,
    loop_device_profile,
    loop_device_supported,
    profile_env,
    remove_device_state,
    run_under_profile,
    subprocess_env,
)
