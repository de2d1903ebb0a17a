"""Pure logic, in this process: settings, discovery parsing, OpenAPI documents, bodies, the
gateway's fence, version names, SimEngine. No test here opens a port it does not own (an aiohttp
test server at most) or starts a process; each file's fixtures are its own."""
