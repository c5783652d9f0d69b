# The test kit's fixtures: the scripted model server, the Slack emulator and signed-request client, and a
# PostgreSQL database / Redis key prefix of this run's own.
pytest_plugins = ["mm_testkit.fixtures_kit", "mm_testkit.fixtures_services"]
