-- A successful cell is a negative example: the Coordinator reads outcomes (Luna never does).
CREATE OR REPLACE TEMP MACRO lunasol_successful(label) AS
    lower(label) IN ('completed', 'success', 'succeeded', 'resolved', 'passed');
