"""Build-time configuration, as the real wheel's generated one (tnx torch_neuronx/_build_config.py:4-18).

``tests/fake_torchneuronx.make_site(build="DEV")`` rewrites BUILD_TYPE; this site is a release wheel.
"""

BUILD_TYPE = "RELEASE"

if BUILD_TYPE == "RELEASE":
    DEFAULT_SYNC_MODE = "1"
    DEFAULT_FALLBACK_ONLY_FOR_UNIMPLEMENTED = "0"
else:
    DEFAULT_SYNC_MODE = "0"
    DEFAULT_FALLBACK_ONLY_FOR_UNIMPLEMENTED = "1"
