"""Function tools: a request's tools and the grammar its reply is held to (`spec`), how they are
written into a prompt (`prompt`), and how a reply is read back as a call (`parser`)."""
