# args: [[["deposit", 100], ["withdraw", 30], ["withdraw", 100], ["deposit", 5]]]
class InsufficientFunds(Exception):
    pass

class BankAccount:
    def __init__(self, owner, balance=0):
        self.owner = owner
        self.balance = balance
        self.history = []

    def deposit(self, amount):
        if amount <= 0:
            raise ValueError("amount must be positive")
        self.balance += amount
        self.history.append(("deposit", amount))

    def withdraw(self, amount):
        if amount > self.balance:
            raise InsufficientFunds(f"cannot withdraw {amount}, balance is {self.balance}")
        self.balance -= amount
        self.history.append(("withdraw", amount))

acct = BankAccount("ann")
errors = []
for op, amount in args[0]:
    try:
        getattr(acct, op)(amount)
    except InsufficientFunds as e:
        errors.append(str(e))
return {"balance": acct.balance, "errors": errors, "history": acct.history}
