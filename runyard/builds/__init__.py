"""Tools built from source: the content digest, the build context, the rules and the port."""
