"""The thin command line: each verb parses arguments and calls one library function."""
