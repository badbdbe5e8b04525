"""The toy articles of the query generators, shared by test_queries, test_distributed and
conftest's ``tiny_mt5`` (whose vocabulary is their words)."""

ARTICLES = [
    (
        10,
        "Le propriétaire du fonds servant ne peut rien faire qui tende à diminuer l'usage de la "
        "servitude ou à le rendre plus incommode ; ainsi il ne peut changer l'état des lieux.",
    ),
    (11, "Nul ne peut être contraint de céder sa propriété, si ce n'est pour cause d'utilité publique."),
    (12, "Abrogé."),
    (13, ""),
    (14, "Les conventions légalement formées tiennent lieu de loi à ceux qui les ont faites. " * 20),
]
