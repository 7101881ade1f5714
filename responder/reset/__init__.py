"""The reset hand-off: the release ladder's reset rung, carried out by a reset controller outside
gpuhealth (NVSentinel's janitor by default) through a request object (`handoff`)."""
