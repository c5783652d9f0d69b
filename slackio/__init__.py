"""The Slack side that the bot and the workers share: the one gateway for every write (`slack_out`, with its
escaping in `mrkdwn`), the Web API client and its counting (`slack_client`), the blocks of a thread and of an
approval (`blocks`, `approval_message`, `long_text`), and the service's metrics.

It stands on the foundation (chatops) and the agent core, and knows neither Celery nor bolt: the bot (which
answers Slack) and the workers (which post turns) both stand on it, so neither reaches into the other for a
piece of Slack.
"""
