"""The release of r3store (recorded in every manifest as ``created_by``)."""

__version__ = "0.3.0"
