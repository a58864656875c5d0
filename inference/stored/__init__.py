"""What clients store through the API: StoredObject (owning tenant, expiry), stored chat completions
and their routes."""
