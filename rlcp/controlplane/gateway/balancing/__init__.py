"""Which member inside the fence takes a request: balancing policies behind one Protocol
(`policy.py`), one module each, made from the settings by `factory.py`. Pure code: the proxy
supplies the members and its own counts of requests out to each."""
