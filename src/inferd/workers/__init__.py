"""Serving one repository with several processes (`inferd serve --workers N`)."""
