"""Document and index lifecycle routes (filled in by the ingestion work)."""

from flask import Blueprint

bp = Blueprint("documents", __name__)
