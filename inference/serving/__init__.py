"""The OpenAI protocol layer: requests -> engine -> StreamDeltas -> wire frames. No torch here."""
