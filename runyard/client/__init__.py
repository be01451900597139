"""The HTTP client of the runyard API, apart from the server core: the CLI's client, an SSE
parser and a terminal spinner. Nothing here imports the server's modules."""
