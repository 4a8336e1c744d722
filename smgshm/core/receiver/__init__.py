"""The reference receiver behind ``serve``: engine faces, reading handles, receipts, faults."""
