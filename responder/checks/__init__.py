"""The release ladder's check rungs as batch/v1 Jobs pinned to the device (`jobs`)."""
